"""A real HTTP scoring service for the guard's tests: it answers 1 − mean pixel / 255, a held-out score that falls
exactly as the toy brightness reward rises (the schema of ``verl_omni/utils/reward_score/http_scorer.py``)."""

from __future__ import annotations

import base64
import io
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
from PIL import Image


def darkness(png_base64: str) -> float:
    pixels = np.asarray(Image.open(io.BytesIO(base64.b64decode(png_base64))).convert("RGB"), dtype=np.float64)
    return 1.0 - pixels.mean() / 255.0


class DarknessServer:
    """``url`` answers ``{"scores": [1 − brightness, ...]}``; ``close()`` stops it."""

    def __init__(self):
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                answer = json.dumps({"scores": [darkness(image) for image in body["images"]]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format, *args):
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}/score"

    def close(self):
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()
