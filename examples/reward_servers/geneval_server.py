"""Reference GenEval reward server: an object detector and a CLIP colour classifier behind HTTP.

Run it on your own GPUs; the ``geneval`` scorer (``verl_omni/utils/reward_score/geneval.py``)
posts images to it and computes GenEval's checks from the answer::

    python examples/reward_servers/geneval_server.py --detector /models/detr-resnet-50 \\
        --clip /models/clip-vit-large-patch14 --device cuda --port 8090
    # reward.diffusion.scorers: [{type: geneval, params: {url: "http://host:8090/detect"}}]

``--detector``: a local directory that transformers' ``AutoModelForObjectDetection`` and
``AutoImageProcessor`` load (a COCO detector: its ``id2label`` names are GenEval's class names,
e.g. DETR or Conditional/Deformable DETR; DETR's timm backbone needs ``verl_omni[rewards]``).
``--clip``: a local ``CLIPModel`` + ``CLIPProcessor`` directory (GenEval uses OpenAI's
ViT-L/14). Nothing is downloaded. The tests run it on CPU with tiny random models
(``python -m verl_omni.utils.tiny_models detr|clip --out DIR``).

``POST /detect`` with ``{"images": [base64 PNG], "color_classes": [[class, ...] per image],
"min_score": float, "max_objects": int}`` answers ``{"detections": [{class: [{"box": [x1, y1, x2,
y2], "score": s, "color": c}]}]}``, one object per image, each class's detections most confident
first, at most ``max_objects``, scores above ``min_score``; ``color`` only for the classes the
request lists for that image. Colours, as GenEval classifies them: zero-shot CLIP over its ten
colour names, each class embedding the normalized mean of three prompts ("a photo of a {c}
{class}", "a photo of a {c}-colored {class}", "a photo of a {c} object"), on the image cropped
to the box. GenEval greys out the background with Mask2Former's instance mask first; a box
detector has no mask, so the crop keeps the background (GenEval's ``bgcolor=original`` option).
A malformed request is answered 400 (the client does not retry it); ``GET /`` answers 200.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import logging
import threading

import torch
from aiohttp import web
from PIL import Image

from verl_omni.utils.reward_score.geneval import GENEVAL_COLORS

logger = logging.getLogger("geneval_server")

COLOR_PROMPTS = ("a photo of a {c} {cls}", "a photo of a {c}-colored {cls}", "a photo of a {c} object")


class BadRequest(ValueError):
    """A request the client must fix (answered 400)."""


class GenEvalDetector:
    """Detector + colour classifier; one forward at a time (a lock), run off the event loop."""

    def __init__(self, detector_dir: str, clip_dir: str, device: str):
        from transformers import AutoImageProcessor, AutoModelForObjectDetection, CLIPModel, CLIPProcessor

        self.device = device
        self.detector = AutoModelForObjectDetection.from_pretrained(detector_dir).to(device).eval()
        self.processor = AutoImageProcessor.from_pretrained(detector_dir)
        self.clip = CLIPModel.from_pretrained(clip_dir).to(device).eval()
        self.clip_processor = CLIPProcessor.from_pretrained(clip_dir)
        self.labels = self.detector.config.id2label
        self._color_heads: dict[str, torch.Tensor] = {}
        self._lock = threading.Lock()

    def color_head(self, name: str) -> torch.Tensor:
        """``[10, D]`` unit colour embeddings for class ``name`` (mean of the three prompts, renormalized)."""
        if name not in self._color_heads:
            texts = [t.format(c=c, cls=name) for c in GENEVAL_COLORS for t in COLOR_PROMPTS]
            tokens = self.clip_processor(text=texts, return_tensors="pt", padding=True, truncation=True).to(self.device)
            emb = self.clip.get_text_features(**tokens).pooler_output.float()
            emb = torch.nn.functional.normalize(emb, dim=-1).view(len(GENEVAL_COLORS), len(COLOR_PROMPTS), -1)
            self._color_heads[name] = torch.nn.functional.normalize(emb.mean(dim=1), dim=-1)
        return self._color_heads[name]

    def colors(self, image: Image.Image, boxes: list[list[float]], name: str) -> list[str]:
        """GenEval colour name of each box's crop."""
        width, height = image.size
        crops = []
        for x1, y1, x2, y2 in boxes:
            left, top = min(max(int(x1), 0), width - 1), min(max(int(y1), 0), height - 1)
            right, bottom = max(min(int(round(x2)), width), left + 1), max(min(int(round(y2)), height), top + 1)
            crops.append(image.crop((left, top, right, bottom)))
        pixels = self.clip_processor(images=crops, return_tensors="pt")["pixel_values"].to(self.device)
        emb = torch.nn.functional.normalize(
            self.clip.get_image_features(pixel_values=pixels).pooler_output.float(), dim=-1
        )
        return [GENEVAL_COLORS[i] for i in (emb @ self.color_head(name).T).argmax(dim=-1).tolist()]

    @torch.no_grad()
    def detect(self, images: list[Image.Image], color_classes: list[list[str]], min_score: float, max_objects: int):
        with self._lock:
            inputs = self.processor(images=images, return_tensors="pt").to(self.device)
            outputs = self.detector(**inputs)
            sizes = [(im.height, im.width) for im in images]
            results = self.processor.post_process_object_detection(outputs, threshold=min_score, target_sizes=sizes)
            answers = []
            for image, result, wanted in zip(images, results, color_classes, strict=True):
                per_class: dict[str, list[dict]] = {}
                order = result["scores"].argsort(descending=True).tolist()
                for k in order:
                    name = self.labels[int(result["labels"][k])]
                    found = per_class.setdefault(name, [])
                    if len(found) < max_objects:
                        found.append({"box": result["boxes"][k].tolist(), "score": float(result["scores"][k])})
                for name in set(wanted) & set(per_class):
                    colors = self.colors(image, [d["box"] for d in per_class[name]], name)
                    for d, color in zip(per_class[name], colors, strict=True):
                        d["color"] = color
                answers.append(per_class)
            return answers


def parse_request(body) -> tuple[list[Image.Image], list[list[str]], float, int]:
    if not isinstance(body, dict) or not isinstance(body.get("images"), list) or not body["images"]:
        raise BadRequest("body must be a JSON object with a non-empty 'images' list of base64 PNGs")
    try:
        images = [Image.open(io.BytesIO(base64.b64decode(s))).convert("RGB") for s in body["images"]]
    except Exception as e:
        raise BadRequest(f"an image is not a base64-encoded PNG: {e}") from e
    color_classes = body.get("color_classes") or [[] for _ in images]
    if len(color_classes) != len(images):
        raise BadRequest(f"'color_classes' must have one list per image ({len(images)}), got {len(color_classes)}")
    min_score, max_objects = float(body.get("min_score", 0.3)), int(body.get("max_objects", 16))
    if not 0.0 <= min_score <= 1.0 or max_objects < 1:
        raise BadRequest(f"min_score must be in [0, 1] and max_objects >= 1, got {min_score}, {max_objects}")
    return images, color_classes, min_score, max_objects


def build_app(model: GenEvalDetector) -> web.Application:
    async def detect(request: web.Request) -> web.Response:
        try:
            args = parse_request(await request.json())
        except (BadRequest, ValueError) as e:
            return web.json_response({"error": str(e)}, status=400)
        return web.json_response({"detections": await asyncio.to_thread(model.detect, *args)})

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "classes": sorted(set(model.labels.values()))})

    app = web.Application(client_max_size=256 * 1024**2)
    app.add_routes([web.post("/detect", detect), web.get("/", health)])
    return app


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--detector", required=True, help="AutoModelForObjectDetection directory")
    parser.add_argument("--clip", required=True, help="CLIPModel + CLIPProcessor directory (colours)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8090)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    model = GenEvalDetector(args.detector, args.clip, args.device)
    logger.info(
        "GenEval server: %d classes on %s, http://%s:%d/detect", len(model.labels), args.device, args.host, args.port
    )
    web.run_app(build_app(model), host=args.host, port=args.port, print=None)


if __name__ == "__main__":
    main()
