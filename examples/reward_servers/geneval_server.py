"""Reference GenEval reward server: an object detector and a CLIP colour classifier behind HTTP.

The ``geneval`` scorer runs the same detector itself, in a child process in its own environment; this
server is for detectors on other machines: the ``geneval_server`` scorer
(``verl_omni/utils/reward_score/geneval.py``) posts images to it and computes GenEval's checks from
the answer::

    python examples/reward_servers/geneval_server.py --detector /models/detr-resnet-50 \\
        --clip /models/clip-vit-large-patch14 --device cuda --port 8090
    # reward.diffusion.scorers: [{type: geneval_server, params: {url: "http://host:8090/detect"}}]

``--detector``: a local directory that transformers' ``AutoModelForObjectDetection`` and
``AutoImageProcessor`` load (a COCO detector: its ``id2label`` names are GenEval's class names,
e.g. DETR or Conditional/Deformable DETR; DETR's timm backbone needs ``verl_omni[rewards]``).
``--clip``: a local ``CLIPModel`` + ``CLIPProcessor`` directory (GenEval uses OpenAI's
ViT-L/14). Nothing is downloaded. The tests run it on CPU with tiny random models
(``python -m verl_omni.utils.tiny_models detr|clip --out DIR``).

``POST /detect`` with ``{"images": [base64 PNG], "color_classes": [[class, ...] per image],
"min_score": float, "max_objects": int}`` answers ``{"detections": [...]}``: the detections the
``geneval`` scorer's own-environment child answers for the same pixels, computed by the same code
(``verl_omni/utils/reward_score/_env_scripts/geneval_detector.py``, where the schema and GenEval's
colour classification are described). A malformed request is answered 400 (the client does not
retry it); ``GET /`` answers 200.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import logging

import torch
from aiohttp import web
from PIL import Image

from verl_omni.utils.reward_score._env_scripts.geneval_detector import GenEvalDetector, detection_options

logger = logging.getLogger("geneval_server")


class BadRequest(ValueError):
    """A request the client must fix (answered 400)."""


def parse_request(body) -> tuple[list[Image.Image], list[list[str]], float, int]:
    if not isinstance(body, dict) or not isinstance(body.get("images"), list) or not body["images"]:
        raise BadRequest("body must be a JSON object with a non-empty 'images' list of base64 PNGs")
    try:
        images = [Image.open(io.BytesIO(base64.b64decode(s))).convert("RGB") for s in body["images"]]
    except Exception as e:
        raise BadRequest(f"an image is not a base64-encoded PNG: {e}") from e
    try:
        return images, *detection_options(body, len(images))
    except (TypeError, ValueError) as e:
        raise BadRequest(str(e)) from e


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
