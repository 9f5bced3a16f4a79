"""GenEval's detector: an object detector and a CLIP colour classifier, answering detections as JSON.

One home for the detection code of the ``geneval`` scorers (``verl_omni/utils/reward_score/geneval.py``):

* run as a script, it is the child of the ``geneval`` scorer in the scorer's own environment
  (``python geneval_detector.py --detector DIR --clip DIR --device cpu``, protocol in ``own_env.py``): the
  request's ``extra`` holds the detection options, its result is the detections;
* imported (``verl_omni.utils.reward_score._env_scripts.geneval_detector``), it serves the reference HTTP server
  (``examples/reward_servers/geneval_server.py``), and ``geneval.py`` reads the colour names from it.

So the two paths answer the same JSON for the same pixels. Its top level imports only the standard library (torch
and transformers load with the models), and nothing of ``verl_omni``: as the child it runs where ``verl_omni`` is
not installed.

Options (the server's request body without its images; the child's ``extra``): ``{"color_classes": [[class, ...]
per image], "min_score": float, "max_objects": int}``. Detections: one object per image, ``{class: [{"box": [x1,
y1, x2, y2], "score": s, "color": c}]}``, each class's detections most confident first, at most ``max_objects``,
scores above ``min_score``; ``color`` only for the classes the options list for that image.

Colours, as GenEval classifies them: zero-shot CLIP over its ten colour names, each class embedding the normalized
mean of three prompts ("a photo of a {c} {class}", "a photo of a {c}-colored {class}", "a photo of a {c} object"),
on the image cropped to the box. GenEval greys out the background with Mask2Former's instance mask first; a box
detector has no mask, so the crop keeps the background (GenEval's ``bgcolor=original`` option).
"""

from __future__ import annotations

import argparse
import threading

# the colour names GenEval classifies into (its COLORS)
GENEVAL_COLORS = ("red", "orange", "yellow", "green", "blue", "purple", "pink", "brown", "black", "white")
COLOR_PROMPTS = ("a photo of a {c} {cls}", "a photo of a {c}-colored {cls}", "a photo of a {c} object")
DEFAULT_MIN_SCORE = 0.3
DEFAULT_MAX_OBJECTS = 16


def detection_options(options, count: int) -> tuple[list[list[str]], float, int]:
    """``(color_classes, min_score, max_objects)`` of the options for ``count`` images; ValueError when malformed."""
    if not isinstance(options, dict):
        raise ValueError(f"detection options must be a JSON object, got {options!r:.200}")
    color_classes = options.get("color_classes") or [[] for _ in range(count)]
    if len(color_classes) != count:
        raise ValueError(f"'color_classes' must have one list per image ({count}), got {len(color_classes)}")
    min_score = float(options.get("min_score", DEFAULT_MIN_SCORE))
    max_objects = int(options.get("max_objects", DEFAULT_MAX_OBJECTS))
    if not 0.0 <= min_score <= 1.0 or max_objects < 1:
        raise ValueError(f"min_score must be in [0, 1] and max_objects >= 1, got {min_score}, {max_objects}")
    return color_classes, min_score, max_objects


class GenEvalDetector:
    """Detector + colour classifier from local directories; one forward at a time (a lock).

    ``detector_dir``: what transformers' ``AutoModelForObjectDetection`` and ``AutoImageProcessor`` load (a COCO
    detector, whose ``id2label`` names are GenEval's class names); ``clip_dir``: a ``CLIPModel`` +
    ``CLIPProcessor`` directory (GenEval uses OpenAI's ViT-L/14). Nothing is downloaded.
    """

    def __init__(self, detector_dir: str, clip_dir: str, device: str):
        from transformers import AutoImageProcessor, AutoModelForObjectDetection, CLIPModel, CLIPProcessor

        self.device = device
        self.detector = AutoModelForObjectDetection.from_pretrained(detector_dir).to(device).eval()
        self.processor = AutoImageProcessor.from_pretrained(detector_dir)
        self.clip = CLIPModel.from_pretrained(clip_dir).to(device).eval()
        self.clip_processor = CLIPProcessor.from_pretrained(clip_dir)
        self.labels = self.detector.config.id2label
        self._color_heads = {}
        self._lock = threading.Lock()

    def color_head(self, name: str):
        """``[10, D]`` unit colour embeddings for class ``name`` (mean of the three prompts, renormalized)."""
        import torch

        if name not in self._color_heads:
            texts = [t.format(c=c, cls=name) for c in GENEVAL_COLORS for t in COLOR_PROMPTS]
            tokens = self.clip_processor(text=texts, return_tensors="pt", padding=True, truncation=True).to(self.device)
            emb = self.clip.get_text_features(**tokens).pooler_output.float()
            emb = torch.nn.functional.normalize(emb, dim=-1).view(len(GENEVAL_COLORS), len(COLOR_PROMPTS), -1)
            self._color_heads[name] = torch.nn.functional.normalize(emb.mean(dim=1), dim=-1)
        return self._color_heads[name]

    def colors(self, image, boxes: list[list[float]], name: str) -> list[str]:
        """GenEval colour name of each box's crop of the PIL ``image``."""
        import torch

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

    def detect(self, images: list, color_classes: list[list[str]], min_score: float, max_objects: int) -> list[dict]:
        """The detections (module docstring) of the RGB PIL ``images``."""
        import torch

        with self._lock, torch.no_grad():
            inputs = self.processor(images=images, return_tensors="pt").to(self.device)
            outputs = self.detector(**inputs)
            sizes = [(im.height, im.width) for im in images]
            results = self.processor.post_process_object_detection(outputs, threshold=min_score, target_sizes=sizes)
            answers = []
            for image, result, wanted in zip(images, results, color_classes, strict=True):
                per_class: dict[str, list[dict]] = {}
                for k in result["scores"].argsort(descending=True).tolist():
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


def images_from_bytes(data: bytes, shape: list[int]) -> list:
    """RGB PIL images of the protocol's uint8 ``[B, 3, H, W]`` bytes."""
    import numpy
    from PIL import Image

    if len(shape) != 4:
        raise ValueError(f"GenEval's detector takes images [B, 3, H, W], got shape {shape}")
    array = numpy.frombuffer(data, dtype=numpy.uint8).reshape(shape).transpose(0, 2, 3, 1)
    return [Image.fromarray(numpy.ascontiguousarray(image)) for image in array]


def main():
    from scorer_child import serve

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--detector", required=True, help="AutoModelForObjectDetection directory")
    parser.add_argument("--clip", required=True, help="CLIPModel + CLIPProcessor directory (colours)")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    detector = GenEvalDetector(args.detector, args.clip, args.device)

    def answer(data, shape, prompts, targets, extra):
        return detector.detect(images_from_bytes(data, shape), *detection_options(extra, shape[0]))

    serve(answer)


if __name__ == "__main__":
    main()
