"""A scripted OpenAI-compatible server (`endpoint` fixture) for `model run --openaiurl` tests: it records each
chat request and answers as told."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest


class OpenAIEndpoint:
    """A scripted OpenAI-compatible server that records each chat request; `script` lists, per request,
    "ok" (a streamed answer), "length" (the same answer cut by its token limit: finish_reason "length") or
    "error" (one chunk, then an error event, as our daemon reports a crash)."""

    def __init__(self, script: list[str]) -> None:
        self.requests: list[dict[str, Any]] = []
        self.script = script
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                endpoint.requests.append({"path": self.path, "body": body})
                kind = endpoint.script.pop(0) if endpoint.script else "ok"
                events: list[dict[str, Any]] = [{"choices": [{"delta": {"content": "first "}}]}]
                if kind == "error":
                    events.append({"error": {"message": "the engine stopped", "type": "server_error"}})
                else:
                    finish = "length" if kind == "length" else None
                    events.append({"choices": [{"delta": {"content": "answer"}, "finish_reason": finish}]})
                data = b"".join(f"data: {json.dumps(e)}\n\n".encode() for e in events)
                if kind != "error":
                    data += b"data: [DONE]\n\n"
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def endpoint() -> Iterator[OpenAIEndpoint]:
    running = OpenAIEndpoint([])
    yield running
    running.stop()
