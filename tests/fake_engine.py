"""A scripted stand-in for an engine process, for scheduler fault tests (the real llama-server path is
tested separately). Run as a script it serves a small OpenAI-compatible API on a Unix socket:

    python tests/fake_engine.py SOCKET [engine flags...]

Behaviour comes from FAKE_* environment variables: FAKE_START_DELAY (seconds before /health says 200),
FAKE_START_GATE (a file: /health says 503, still loading, until it exists),
FAKE_EXIT_AT_START (exit code, before serving), FAKE_CHUNKS / FAKE_CHUNK_DELAY (streamed answer),
FAKE_CHUNK_PAD (x's after each token's text), FAKE_CRASH_AFTER (exit after that many streamed chunks),
FAKE_EVENTS (a file it appends events to: started, request, token, completed, cancelled), FAKE_CHILD
(start a child process, as vLLM starts its workers; its pid is in the `child` event), FAKE_STOP_DELAY
(seconds between SIGTERM and exiting, logged as `exiting`), FAKE_BODIES=1 (each `request` event carries the
body as the engine received it, byte for byte).
Connections are kept alive (HTTP/1.1); each `request` event says how many requests its connection has
carried (`served`). On a connection's second and later requests FAKE_REUSED scripts an engine's idle-close
race: `drop` closes it unanswered, `cut` closes it after the head and one chunk (event `reused_closed`).
Each first request on a connection says in `waited` the seconds since the connection was opened;
FAKE_DROP_WAITED (seconds) closes a connection unanswered whose first request came later than that (an
engine's idle timeout racing a connection opened ahead; event `waited_closed`).
FAKE_CONNECTION_CLOSE=1 answers streams with `Connection: close`; FAKE_CLOSE_AFTER_STREAM (seconds)
closes the connection that long after each stream without saying so (as llama-server b11434 does, at once),
whatever came meanwhile unread (event `dropped_unread`);
FAKE_STREAM_FRAMING frames a chat stream otherwise than chunked: `length` (the whole stream, then sent with
its Content-Length), `close` (no length, the end of the connection ends it). FAKE_FIRST_CHUNK_DELAY:
seconds between a stream's head and its first chunk or event (llama-server sends the head as its prefill
starts); a connection closed meanwhile ends it (event `prefill_cancelled`, with the time it was seen), as
one closed during a FAKE_CHUNK_DELAY does (event `cancelled`).
Hostile engines: FAKE_STALL_AFTER (after that many streamed chunks, send nothing more, the connection left
open, /health still answered; event `stalled`), FAKE_BAD_CHUNK_AFTER (after that many, a chunk whose size
line is invalid, then the connection closed; event `bad_chunk`).
Streams end as llama-server's do (finish reason, usage if asked).
Tool calling (a request with `tools`; its body is logged as a `chat` event): FAKE_TOOL_CALL names a function
the model calls, as llama-server streams a call (id and name first, the arguments in two fragments, finish
reason `tool_calls`), with FAKE_TOOL_ARGS (default: the last user message as `{"query": ...}`), until the
request holds FAKE_TOOL_ROUNDS tool results (default 1); then the answer is `found: <each tool result>`.
FAKE_TEXT scripts the answer's text (streamed in pieces of a few characters), e.g. a call written as text
(FAKE_TEXT_FILE: read from that file, for a text over the 128 KiB an environment variable may hold);
FAKE_REASONING the reasoning before it (a chat stream's `reasoning_content` deltas, as llama-server's);
`/v1/messages` answers them as an Anthropic message (the reasoning a thinking block signed with an empty
string, which a stream stops at the message's end), streamed as llama-server b11434 streams one; with
FAKE_NO_MESSAGE_START=1 that stream lacks its `message_start` (as llama-server b11434's does when its first
tokens are an incomplete UTF-8 sequence). `/v1/messages/count_tokens` counts the 3 input tokens its
messages report.
`/v1/messages` streams the same script as `tool_use` and text blocks (the results read from `tool_result`
blocks), as llama-server's own Messages route.
FAKE_TOOLS_REJECT=1 answers any request with tools as llama-server does when the chat template cannot take
them (500, a Jinja exception).
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import socketserver
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from modelrunner.artifact.model_config import ModelConfig
from modelrunner.engines import llamacpp_capabilities
from modelrunner.engines.base import (
    Engine,
    EngineStatus,
    InstallState,
    LaunchSpec,
    Mode,
    ModelForEngine,
    Needs,
    ProgressCallback,
    RunnerSettings,
)
from modelrunner.errors import BadRequest

SCRIPT = Path(__file__).resolve()
INPUT_TOKENS = 3  # the prompt of every Anthropic message it answers, as counted and as reported


class FakeEngine(Engine):
    """An Engine whose runners are this script; `env` scripts their behaviour."""

    formats = frozenset({"gguf"})
    modes = frozenset({Mode.COMPLETION, Mode.EMBEDDING, Mode.RERANKING})

    def __init__(
        self, name: str = "llama.cpp", env: dict[str, str] | None = None, memory: int = 1000
    ) -> None:
        self.name = name
        # it plays llama-server, vLLM or another engine, with their API's ways
        self.assembles_unstreamed = self.completions_json_schema = name == "llama.cpp"
        self.ignores_forced_tool_choice = name == "llama.cpp"
        self.schema_grammar = name in ("llama.cpp", "vllm")
        self.takes_draft_model = name == "llama.cpp"
        self.env = env or {}
        self.memory = memory

    def status(self) -> EngineStatus:
        return EngineStatus(InstallState.RUNNING, version="fake-1")

    def install(self, progress: ProgressCallback, gpu: str = "auto", force: bool = False) -> EngineStatus:
        return self.status()

    def uninstall(self) -> None:
        pass

    def validate_runtime_flags(self, flags: list[str]) -> None:
        for flag in flags:
            if flag.startswith("-") and not flag.startswith("--fake-"):
                raise BadRequest(f"runtime flag {flag} is not allowed")
            if "/" in flag:
                raise BadRequest("runtime flag values must not be paths")

    def check_request(self, name: str, config: ModelConfig, bundle: Path, needs: Needs) -> None:
        if self.name == "llama.cpp":  # what llama-server can do with the bundle's projector and template
            llamacpp_capabilities.check_request(name, config, bundle, needs)

    def capabilities(self, config: ModelConfig, bundle: Path) -> list[str]:
        if self.name == "llama.cpp":
            return llamacpp_capabilities.capabilities(config, bundle)
        return super().capabilities(config, bundle)

    def launch_spec(
        self, model: ModelForEngine, mode: Mode, settings: RunnerSettings, socket: Path
    ) -> LaunchSpec:
        argv = [sys.executable, str(SCRIPT), str(socket), "--mode", mode.value]
        if settings.context_size is not None:
            argv += ["--ctx-size", str(settings.context_size)]
        argv += list(settings.runtime_flags)
        return LaunchSpec(argv=argv, socket=socket, env=dict(self.env))

    def estimate_memory(self, model: ModelForEngine, settings: RunnerSettings) -> int:
        return self.memory


def _event(name: str, **fields: object) -> None:
    path = os.environ.get("FAKE_EVENTS")
    if path:
        with open(path, "a") as handle:
            handle.write(json.dumps({"event": name, "pid": os.getpid(), **fields}) + "\n")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    started = time.monotonic()

    def setup(self) -> None:
        super().setup()
        self.accepted = time.monotonic()  # one handler per connection

    def log_message(self, format: str, *args: object) -> None:
        pass

    def address_string(self) -> str:
        return "unix"

    def _json(self, status: int, payload: object) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/health":
            ready = time.monotonic() - self.started >= float(os.environ.get("FAKE_START_DELAY", "0"))
            gate = os.environ.get("FAKE_START_GATE")
            ready = ready and (gate is None or os.path.exists(gate))
            self._json(200 if ready else 503, {"status": "ok" if ready else "loading"})
        elif self.path == "/props":
            self._json(200, {"argv": sys.argv[1:], "pid": os.getpid()})
        elif self.path == "/metrics":
            body = b"# TYPE fake_requests_total counter\nfake_requests_total 3\n"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        else:
            self._json(404, {"error": {"message": "not found"}})

    def do_POST(self) -> None:
        self.framing = "chunked"  # of this answer's stream (FAKE_STREAM_FRAMING: the chat stream's)
        length = int(self.headers.get("Content-Length", "0"))
        raw = self.rfile.read(length)
        request = json.loads(raw or b"{}")
        self.served = getattr(self, "served", 0) + 1  # one handler per connection
        body = {"body": raw.decode()} if os.environ.get("FAKE_BODIES") else {}
        waited = round(time.monotonic() - self.accepted, 3) if self.served == 1 else None
        _event("request", path=self.path, served=self.served, waited=waited, **body)
        drop_waited = os.environ.get("FAKE_DROP_WAITED")
        if drop_waited and waited is not None and waited > float(drop_waited):
            _event("waited_closed")
            self.close_connection = True
            return
        reused = os.environ.get("FAKE_REUSED") if self.served > 1 else None
        if reused == "drop":
            _event("reused_closed", served=self.served)
            self.close_connection = True
            return
        if self.path == "/v1/embeddings":
            self._json(
                200, {"object": "list", "data": [{"object": "embedding", "index": 0, "embedding": [0.1] * 8}]}
            )
            return
        if "tools" in request:
            _event("chat", body=request)
            if os.environ.get("FAKE_TOOLS_REJECT"):
                message = "Value is not callable: null at row 1, column 9 (Jinja Exception)"
                self._json(500, {"error": {"code": 500, "message": message, "type": "server_error"}})
                return
        if self.path == "/v1/messages/count_tokens":
            self._json(200, {"input_tokens": INPUT_TOKENS})
            return
        if self.path == "/v1/messages" and os.environ.get("FAKE_TOOL_CALL") and request.get("stream"):
            self._tool_message_stream(request)
            return
        if self.path == "/v1/messages":
            long_chunks = os.environ.get("FAKE_CHUNKS")  # a long answer, as on the chat route: t0 t1 ...
            default = "".join(f"t{i} " for i in range(int(long_chunks))) if long_chunks else "hi"
            self._message(request, _fake_text() or default)
            return
        if os.environ.get("FAKE_TOOL_CALL") and request.get("stream"):
            self._tool_stream(request)
            return
        if not request.get("stream"):
            self._json(
                200,
                {
                    "object": "chat.completion",
                    "choices": [
                        {
                            "index": 0,
                            "message": {
                                "role": "assistant",
                                "content": _fake_text() or "hi",
                                **_reasoning(os.environ.get("FAKE_REASONING")),
                            },
                        }
                    ],
                },
            )
            return
        self.framing = os.environ.get("FAKE_STREAM_FRAMING", "chunked")
        self.held = b""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        if self.framing == "chunked":
            self.send_header("Transfer-Encoding", "chunked")
        if os.environ.get("FAKE_CONNECTION_CLOSE") or self.framing == "close":
            self.send_header("Connection", "close")
        if self.framing != "length":  # a sized stream's head goes with its whole body (`_chunk`)
            self.end_headers()
        if not self._prefill():
            return
        text = _fake_text()
        pieces = [text[i : i + 7] for i in range(0, len(text), 7)] if text else []
        chunks = len(pieces) if text else int(os.environ.get("FAKE_CHUNKS", "5"))
        crash_after = int(os.environ.get("FAKE_CRASH_AFTER", "-1"))
        stall_after = int(os.environ.get("FAKE_STALL_AFTER", "-1"))
        bad_chunk_after = int(os.environ.get("FAKE_BAD_CHUNK_AFTER", "-1"))
        pad = int(os.environ.get("FAKE_CHUNK_PAD", "0"))
        top = {
            "id": "chatcmpl-fake",
            "created": 1,
            "model": request.get("model"),
            "object": "chat.completion.chunk",
        }
        try:
            thought = os.environ.get("FAKE_REASONING", "")
            for piece in (thought[i : i + 7] for i in range(0, len(thought), 7)):
                data = json.dumps({**top, "choices": [{"index": 0, "delta": {"reasoning_content": piece}}]})
                self._chunk(f"data: {data}\n\n".encode())
            for i in range(chunks):
                if i == crash_after:
                    _event("crash")
                    os._exit(3)
                if i == stall_after:
                    _event("stalled")
                    threading.Event().wait()  # until the runner is stopped
                if i == bad_chunk_after:
                    _event("bad_chunk")
                    self.wfile.write(b"0x5\r\nhello\r\n")  # RFC 9112 has no 0x
                    self.wfile.flush()
                    self.close_connection = True
                    return
                content = pieces[i] if text else f"t{i} " + "x" * pad
                data = json.dumps({**top, "choices": [{"index": 0, "delta": {"content": content}}]})
                self._chunk(f"data: {data}\n\n".encode())
                if reused == "cut":
                    _event("reused_closed", served=self.served)
                    self.close_connection = True
                    return
                _event("token", index=i)
                if not self._silent(float(os.environ.get("FAKE_CHUNK_DELAY", "0")), "cancelled"):
                    return
            # as llama-server ends a stream: the finish reason, then the usage when asked for
            end = {**top, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
            self._chunk(f"data: {json.dumps(end)}\n\n".encode())
            if (request.get("stream_options") or {}).get("include_usage"):
                usage = {"prompt_tokens": 3, "completion_tokens": chunks, "total_tokens": 3 + chunks}
                self._chunk(f"data: {json.dumps({**top, 'choices': [], 'usage': usage})}\n\n".encode())
            self._chunk(b"data: [DONE]\n\n")
            self._chunk(b"")
            _event("completed")
            close_after = os.environ.get("FAKE_CLOSE_AFTER_STREAM")
            if close_after is not None:  # unannounced: the head said nothing of it
                time.sleep(float(close_after))
                self.close_connection = True
                waiting = select.select([self.connection], [], [], 0)[0]
                if waiting and self.connection.recv(1, socket.MSG_PEEK):
                    _event("dropped_unread")  # a request came meanwhile: it goes unanswered
        except (BrokenPipeError, ConnectionResetError):
            _event("cancelled")

    def _tool_stream(self, request: dict[str, Any]) -> None:
        """A function call while the request has fewer than FAKE_TOOL_ROUNDS tool results (and offers
        tools), else an answer quoting them."""
        messages = request.get("messages") or []
        results = [m.get("content") for m in messages if m.get("role") == "tool"]
        top = {
            "id": "chatcmpl-fake",
            "created": 1,
            "model": request.get("model"),
            "object": "chat.completion.chunk",
        }
        if request.get("tools") and len(results) < int(os.environ.get("FAKE_TOOL_ROUNDS", "1")):
            question = next((m.get("content") for m in reversed(messages) if m.get("role") == "user"), "")
            arguments = os.environ.get("FAKE_TOOL_ARGS") or json.dumps({"query": question})
            call = {"index": 0, "id": f"call_{len(results)}", "type": "function"}
            deltas: list[dict[str, Any]] = [
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {**call, "function": {"name": os.environ["FAKE_TOOL_CALL"], "arguments": ""}}
                    ],
                },
                {"tool_calls": [{"index": 0, "function": {"arguments": arguments[: len(arguments) // 2]}}]},
                {"tool_calls": [{"index": 0, "function": {"arguments": arguments[len(arguments) // 2 :]}}]},
            ]
            finish = "tool_calls"
        else:
            deltas = [{"content": "found: " + " | ".join(str(r) for r in results)}]
            finish = "stop"
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for delta in [*deltas, {}]:
            choice = {"index": 0, "delta": delta, "finish_reason": None if delta else finish}
            self._chunk(f"data: {json.dumps({**top, 'choices': [choice]})}\n\n".encode())
        self._chunk(b"data: [DONE]\n\n")
        self._chunk(b"")

    def _tool_message_stream(self, request: dict[str, Any]) -> None:
        """The Messages API's `_tool_stream`: a `tool_use` block while the request has fewer than
        FAKE_TOOL_ROUNDS `tool_result` blocks (and offers tools), else a text block quoting them, streamed
        as llama-server streams them (the input in two `input_json_delta` fragments)."""
        messages = request.get("messages") or []
        blocks = [b for m in messages if isinstance(m.get("content"), list) for b in m["content"]]
        results = [_block_text(b.get("content")) for b in blocks if b.get("type") == "tool_result"]
        if request.get("tools") and len(results) < int(os.environ.get("FAKE_TOOL_ROUNDS", "1")):
            arguments = os.environ.get("FAKE_TOOL_ARGS") or "{}"
            name = os.environ["FAKE_TOOL_CALL"]
            block = {"type": "tool_use", "id": f"toolu_{len(results)}", "name": name, "input": {}}
            deltas = [{"type": "input_json_delta", "partial_json": part} for part in _halves(arguments)]
            stop = "tool_use"
        else:
            block = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": "found: " + " | ".join(results)}]
            stop = "end_turn"
        usage = {"input_tokens": INPUT_TOKENS, "output_tokens": 5}
        message: dict[str, Any] = {
            "id": "msg_fake",
            "type": "message",
            "role": "assistant",
            "model": request.get("model"),
            "content": [],
            "stop_reason": None,
            "usage": usage,
        }
        events: list[dict[str, Any]] = [
            {"type": "message_start", "message": message},
            {"type": "content_block_start", "index": 0, "content_block": block},
            *({"type": "content_block_delta", "index": 0, "delta": delta} for delta in deltas),
            {"type": "content_block_stop", "index": 0},
            {"type": "message_delta", "delta": {"stop_reason": stop}, "usage": {"output_tokens": 5}},
            {"type": "message_stop"},
        ]
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for event in events:
            self._chunk(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode())
        self._chunk(b"")

    def _message(self, request: dict[str, Any], text: str) -> None:
        thought = os.environ.get("FAKE_REASONING", "")
        thinking = [{"type": "thinking", "thinking": thought, "signature": ""}] if thought else []
        message = {
            "id": "msg_fake",
            "type": "message",
            "role": "assistant",
            "model": request.get("model"),
            "content": [*thinking, {"type": "text", "text": text}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": INPUT_TOKENS, "output_tokens": 5},
        }
        pieces = [text[i : i + 7] for i in range(0, len(text), 7)]
        delay = float(os.environ.get("FAKE_CHUNK_DELAY", "0"))  # per piece, as the chat route's chunks
        if not request.get("stream"):
            time.sleep(delay * len(pieces))
            self._json(200, message)
            return
        start = {"type": "message_start", "message": {**message, "content": [], "stop_reason": None}}
        at = len(thinking)  # the text block's index; a thinking block is block 0, stopped at the end
        thoughts = [thought[i : i + 7] for i in range(0, len(thought), 7)]
        events: list[dict[str, Any]] = [
            *([] if os.environ.get("FAKE_NO_MESSAGE_START") else [start]),
            *(
                [
                    {
                        "type": "content_block_start",
                        "index": 0,
                        "content_block": {"type": "thinking", "thinking": ""},
                    }
                ]
                if thought
                else []
            ),
            *(
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "thinking_delta", "thinking": p},
                }
                for p in thoughts
            ),
            {"type": "content_block_start", "index": at, "content_block": {"type": "text", "text": ""}},
            *(
                {"type": "content_block_delta", "index": at, "delta": {"type": "text_delta", "text": p}}
                for p in pieces
            ),
            *(
                [
                    {
                        "type": "content_block_delta",
                        "index": 0,
                        "delta": {"type": "signature_delta", "signature": ""},
                    },
                    {"type": "content_block_stop", "index": 0},
                ]
                if thought
                else []
            ),
            {"type": "content_block_stop", "index": at},
            {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 5}},
            {"type": "message_stop"},
        ]
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        if not self._prefill():
            return
        for event in events:
            self._chunk(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode())
            if event["type"] == "content_block_delta" and not self._silent(delay, "cancelled"):
                return
        self._chunk(b"")

    def _prefill(self) -> bool:
        """FAKE_FIRST_CHUNK_DELAY seconds of silence after a stream's head (a prefill): `_silent`'s."""
        return self._silent(float(os.environ.get("FAKE_FIRST_CHUNK_DELAY", "0")), "prefill_cancelled")

    def _silent(self, seconds: float, closed_event: str) -> bool:
        """Seconds of silence in an answer, watching the connection as llama-server does: False when it was
        closed meanwhile (event `closed_event`, `at` the time.time() it was seen)."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            if not select.select([self.connection], [], [], left)[0]:
                continue
            try:
                closed = not self.connection.recv(1, socket.MSG_PEEK)
            except OSError:
                closed = True
            if closed:
                _event(closed_event, at=time.time())
                self.close_connection = True
                return False
            time.sleep(left)  # bytes of a next request: read once this answer is done
        return True

    def _chunk(self, data: bytes) -> None:
        """A piece of the answer's body (b"": its end), framed as FAKE_STREAM_FRAMING says."""
        framing = getattr(self, "framing", "chunked")
        if framing == "length":
            self.held += data
            if data:
                return
            self.send_header("Content-Length", str(len(self.held)))
            self.end_headers()
            data = self.held
        if framing == "chunked":
            data = f"{len(data):x}\r\n".encode() + data + b"\r\n"
        self.wfile.write(data)
        self.wfile.flush()
        if framing == "close" and not data:
            self.close_connection = True  # the end of the connection is the end of the answer


def _halves(text: str) -> list[str]:
    return [text[: len(text) // 2], text[len(text) // 2 :]]


def _block_text(content: Any) -> str:
    """A `tool_result`'s content: a string, or text blocks."""
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return str(content)


def _fake_text() -> str | None:
    path = os.environ.get("FAKE_TEXT_FILE")
    return Path(path).read_text() if path else os.environ.get("FAKE_TEXT")


def _reasoning(text: str | None) -> dict[str, str]:
    return {"reasoning_content": text} if text else {}


class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    request_queue_size = 128


def main() -> None:
    socket_path = sys.argv[1]
    exit_code = os.environ.get("FAKE_EXIT_AT_START")
    if exit_code:
        print(
            f"fatal: cannot load model from {Path(socket_path).parent}/model.gguf",
            file=sys.stderr,
            flush=True,
        )
        sys.exit(int(exit_code))
    _event("started", argv=sys.argv[2:])
    if os.environ.get("FAKE_CHILD"):
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
        _event("child", child=child.pid)
    stop_delay = float(os.environ.get("FAKE_STOP_DELAY", "0"))

    def on_sigterm(*_: object) -> None:
        time.sleep(stop_delay)
        _event("exiting")
        os._exit(0)

    signal.signal(signal.SIGTERM, on_sigterm)
    with Server(socket_path, Handler) as server:
        server.serve_forever()


if __name__ == "__main__":
    main()
