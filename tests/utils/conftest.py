"""Shared fixtures for ``tests/utils``: the tiny random CLIP and a local HTTP server for scorers."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from verl_omni.utils.tiny_models import build_tiny_model


@pytest.fixture(scope="session")
def tiny_clip_dir(tmp_path_factory):
    """A tiny random CLIP (model, processor, aesthetic head) written once per session."""
    return build_tiny_model("clip", tmp_path_factory.mktemp("tiny_clip"), seed=0)


class ScoringServer:
    """A real HTTP server on 127.0.0.1 standing in for a VLM (OpenAI chat) or a user's scoring service.

    Attributes set by tests: ``reply_text`` (chat answer), ``chat_reply`` (callable on the JSON
    body giving the chat answer text, instead of ``reply_text``), ``answer`` (a JSON answer sent
    as it is, for malformed ones), ``status`` (HTTP status to answer),
    ``hold`` (an event: requests wait until it is set, so the server never answers in time while unset;
    closing the server sets it), ``barrier`` (requests wait until that many are in flight),
    ``scores_from_payload`` (callable building the ``/score`` answer), ``fail_when`` (callable on the
    JSON body: answer 503 when true). Recorded: ``requests``
    (JSON bodies received; :meth:`wait_for_requests` waits for a count), ``max_inflight``.
    """

    def __init__(self):
        self.reply_text = ""
        self.chat_reply = None
        self.answer = None
        self.status = 200
        self.hold: threading.Event | None = None
        self.barrier: threading.Barrier | None = None
        self.scores_from_payload = None
        self.fail_when = None
        self.requests: list[dict] = []
        self.inflight = 0
        self.max_inflight = 0
        self._lock = threading.Lock()
        self._received = threading.Condition(self._lock)
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_cls())
        self._httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()

    def _answer(self, path: str, body: dict) -> tuple[int, dict]:
        with self._lock:
            self.requests.append(body)
            self._received.notify_all()
            self.inflight += 1
            self.max_inflight = max(self.max_inflight, self.inflight)
        try:
            if self.barrier is not None:
                self.barrier.wait(timeout=30)
            if self.hold is not None:
                self.hold.wait()
        except threading.BrokenBarrierError:
            return 500, {"error": "barrier broken: requests were not concurrent"}
        finally:
            with self._lock:
                self.inflight -= 1
        if self.fail_when is not None and self.fail_when(body):
            return 503, {"error": "request refused by the test's fail_when"}
        if self.status != 200:
            return self.status, {"error": f"status {self.status} chosen by the test"}
        if self.answer is not None:
            return 200, self.answer
        if path.endswith("/chat/completions"):
            text = self.reply_text if self.chat_reply is None else self.chat_reply(body)
            return 200, {"choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]}
        return 200, self.scores_from_payload(body)

    def _handler_cls(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                status, answer = server._answer(self.path, body)
                data = json.dumps(answer).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up waiting (a held request): nobody is left to answer

            def log_message(self, format, *args):
                pass

        return Handler

    def wait_for_requests(self, count: int, timeout: float = 60) -> list[dict]:
        """The requests received once there are ``count`` of them (a client's give-up can precede the server's
        read of its last request); fails after ``timeout`` seconds."""
        with self._received:
            if not self._received.wait_for(lambda: len(self.requests) >= count, timeout):
                raise AssertionError(f"the server received {len(self.requests)} requests, expected {count}")
            return list(self.requests)

    def close(self):
        if self.hold is not None:
            self.hold.set()
        self._httpd.shutdown()
        self._httpd.server_close()


@pytest.fixture
def scoring_server():
    server = ScoringServer()
    yield server
    server.close()


@pytest.fixture
def closed_port_url():
    """The URL of a loopback port nothing listens on (bound, then released)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"
