"""A client that leaves stops the engine's generation and frees its runner: on every route, streamed or
not, with each official client the project tests (openai, ollama, anthropic) and raw HTTP on both relays.

The real llama-server serves the tiny model trained for 32k tokens, so a generation of 20,000 tokens runs
for a minute unless it is stopped. The engine is watched through its own `/slots`: how many tokens it had
decoded when the client left, and how many when it stopped. While the test waits it polls `/slots`, which
keeps llama-server's result queue busy: an unstreamed generation would then never be cancelled by the
engine alone (server-queue.cpp polls its client only after an idle second), so these tests fail unless
the daemon makes the cancellation happen.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import ollama
import openai
import pytest
from anthropic.types import MessageParam
from anthropic.types.message_create_params import MessageCreateParamsBase
from openai.types.completion_create_params import CompletionCreateParamsNonStreaming
from openai.types.responses.response_create_params import ResponseCreateParamsBase

from tests.daemon import Daemon, engine_log, free_port
from tests.models import write_tiny_gguf

MAX_TOKENS = 20000
HI: list[MessageParam] = [{"role": "user", "content": "hi"}]
MEASURED: dict[str, tuple[int, int]] = {}  # case: (tokens decoded when the client left, after it left)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, llama_server: Path) -> Iterator[Daemon]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LLAMA_SERVER_PATH", str(llama_server))
        home = tmp_path_factory.mktemp("disconnect") / "home"
        running = Daemon(home, free_port()).start()
    gguf = write_tiny_gguf(home.parent / "long.gguf", context_length=32768)
    running.cli("package", "--gguf", str(gguf), "long")
    # one slot (the one to watch), and no end of text: random weights would pick it early
    running.cli("configure", "long", "--", "--parallel", "1", "--ignore-eos")
    yield running
    running.stop()
    if MEASURED:
        print("\ntokens the engine decoded after the client left, per case:")
        for case, (before, after) in MEASURED.items():
            print(f"  {case:<44} left at {before:>5}, then {after:>4} more")


def engine_socket(daemon: Daemon) -> str:
    [runner] = [r for r in daemon.http("GET", "/engines/ps").json() if r["mode"] == "completion"]
    argv = Path(f"/proc/{runner['pid']}/cmdline").read_bytes().decode().split("\0")
    return argv[argv.index("--host") + 1]


def slot(daemon: Daemon) -> dict[str, Any]:
    with httpx.Client(transport=httpx.HTTPTransport(uds=engine_socket(daemon)), timeout=10) as engine:
        response = engine.get("http://engine/slots")
    response.raise_for_status()  # 503 while the model loads
    [state] = response.json()
    result: dict[str, Any] = state
    return result


def decoded(state: dict[str, Any]) -> int:
    return int(state["next_token"][0]["n_decoded"]) if "next_token" in state else 0


def wait(condition: Callable[[], bool], what: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for: {what}")
        time.sleep(0.05)


def generating(daemon: Daemon) -> bool:
    try:
        state = slot(daemon)
    except (ValueError, httpx.HTTPError):
        return False  # not loaded yet (or no runner yet)
    return bool(state["is_processing"]) and decoded(state) >= 3


def leaves(
    daemon: Daemon, case: str, request: Callable[[], object], leave: Callable[[], None] | None = None
) -> None:
    """Run `request` in a thread; once the engine generates, `leave()` makes the client go (without it,
    the client's own timeout does); then the engine must stop generating and the runner be released."""
    errors: list[BaseException] = []
    seen = len(access_lines(daemon))

    def run() -> None:
        try:
            request()
        except BaseException as exc:  # the client's own error when it leaves
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    wait(lambda: generating(daemon), f"{case}: the engine to generate")
    state = slot(daemon)
    if leave is not None:
        leave()
    deadline = time.monotonic() + 60
    while thread.is_alive():  # the engine's state until the client is gone: the last one is when it left
        assert time.monotonic() < deadline, f"{case}: the client did not leave"
        with contextlib.suppress(ValueError, httpx.HTTPError):
            if (later := slot(daemon))["is_processing"] and later["id_task"] == state["id_task"]:
                state = later
        time.sleep(0.005)
    wait(lambda: not slot(daemon)["is_processing"], f"{case}: the engine to stop generating")
    # the engine's own count when it stopped: its cache, prompt and generated tokens
    ended = re.compile(rf"task {state['id_task']} \| stop processing: n_tokens = (\d+)")
    wait(lambda: ended.search(engine_log(daemon.home, "llama.cpp")) is not None, f"{case}: the release line")
    match = ended.search(engine_log(daemon.home, "llama.cpp"))
    assert match is not None
    cached = int(match.group(1))
    assert cached < MAX_TOKENS, f"{case}: the engine generated everything"
    wait(
        lambda: not any(r["in_use"] for r in daemon.http("GET", "/engines/ps").json()),
        f"{case}: the runner to be released",
    )
    # counted as the client's leaving, never as an engine failure: a 499 unless the answer had started
    wait(lambda: len(access_lines(daemon)) > seen, f"{case}: its access line")
    [line] = access_lines(daemon)[seen:]
    assert "outcome=client_left" in line and f"status={200 if 'streamed' in case else 499}" in line, line
    # the slot's cache grows by one token per token decoded: what it held when the client left, and after
    MEASURED[case] = (decoded(state), max(0, cached - int(state["n_prompt_tokens"])))


def access_lines(daemon: Daemon) -> list[str]:
    """The daemon's access lines of the requests a case made (the test's own `/engines/ps` left out)."""
    log = (daemon.home / "logs" / "daemon.log").read_text().splitlines()
    return [line for line in log if "event=request" in line and "path=/engines/ps" not in line]


class Gate:
    """Lets a client read its stream until the test says leave."""

    def __init__(self) -> None:
        self.leave = threading.Event()


def openai_client(daemon: Daemon, **options: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=daemon.url + "/engines/v1", api_key="unused", max_retries=0, **options)


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": "long", "messages": HI, "max_tokens": MAX_TOKENS, **extra}


# -- streamed: the client closes its stream ----------------------------------------------------------


def test_openai_chat_stream(daemon: Daemon) -> None:
    gate = Gate()

    def request() -> None:
        with openai_client(daemon).chat.completions.create(**chat(stream=True)) as stream:
            for _ in stream:
                if gate.leave.is_set():
                    return

    leaves(daemon, "openai chat, streamed (front)", request, gate.leave.set)


ROUTES = [
    ("/v1/chat/completions", {"messages": HI}, "front"),
    ("/v1/chat/completions", {"messages": HI}, "asgi"),
    ("/v1/completions", {"prompt": "once upon a time"}, "front"),
    ("/v1/completions", {"prompt": "once upon a time"}, "asgi"),
    ("/api/chat", {"messages": HI, "options": {"num_predict": MAX_TOKENS}}, "asgi"),
    ("/api/generate", {"prompt": "hi", "options": {"num_predict": MAX_TOKENS}}, "asgi"),
    ("/anthropic/v1/messages", {"messages": HI}, "asgi"),
    ("/v1/responses", {"input": "hi", "max_output_tokens": MAX_TOKENS}, "asgi"),
]


@pytest.mark.parametrize(("path", "body", "relay"), ROUTES)
@pytest.mark.parametrize("stream", [True, False])
def test_raw_http(daemon: Daemon, path: str, body: dict[str, Any], stream: bool, relay: str) -> None:
    request_body = {"model": "long", "max_tokens": MAX_TOKENS, "stream": stream, **body}
    # an Origin makes the front hand an OpenAI request to the ASGI stack (CORS is the middleware's); the
    # other APIs are always served there
    origin = b"Origin: http://localhost:3000\r\n" if relay == "asgi" and path.startswith("/v1/c") else b""
    data = json.dumps(request_body).encode()
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n".encode()
    gate = Gate()

    def request() -> None:
        with socket.create_connection(("127.0.0.1", daemon.port)) as sock:
            sock.sendall(head + origin + b"Content-Length: %d\r\n\r\n" % len(data) + data)
            sock.settimeout(0.005)
            while not gate.leave.is_set():
                try:
                    if not sock.recv(65536):
                        return
                except TimeoutError:
                    pass

    leaves(daemon, f"http {path}, {'streamed' if stream else 'whole'} ({relay})", request, gate.leave.set)


# -- not streamed: the client's own timeout makes it leave --------------------------------------------


# openai.Timeout, not httpx.Timeout: the SDK's own HTTP library (httpx2 since openai 3.6x) refuses the other


def test_openai_chat_not_streamed(daemon: Daemon) -> None:
    client = openai_client(daemon, timeout=openai.Timeout(120, read=3))
    leaves(daemon, "openai chat, whole", lambda: client.chat.completions.create(**chat()))


def test_openai_completions_not_streamed(daemon: Daemon) -> None:
    client = openai_client(daemon, timeout=openai.Timeout(120, read=3))
    body: CompletionCreateParamsNonStreaming = {"model": "long", "prompt": "hi", "max_tokens": MAX_TOKENS}
    leaves(daemon, "openai completions, whole", lambda: client.completions.create(**body))


def test_openai_responses(daemon: Daemon) -> None:
    client = openai_client(daemon, timeout=openai.Timeout(120, read=3))
    body: ResponseCreateParamsBase = {"model": "long", "input": "hi", "max_output_tokens": MAX_TOKENS}
    leaves(daemon, "openai responses, whole", lambda: client.responses.create(**body))
    gate = Gate()

    def streamed() -> None:
        with openai_client(daemon).responses.create(**body, stream=True) as stream:
            for _ in stream:
                if gate.leave.is_set():
                    return

    leaves(daemon, "openai responses, streamed", streamed, gate.leave.set)


def test_ollama_client(daemon: Daemon) -> None:
    options = {"num_predict": MAX_TOKENS}
    whole = ollama.Client(host=daemon.url, timeout=3)
    leaves(
        daemon,
        "ollama chat, whole",
        lambda: whole.chat(model="long", messages=HI, options=options),
    )
    leaves(
        daemon,
        "ollama generate, whole",
        lambda: whole.generate(model="long", prompt="hi", options=options),
    )
    client = ollama.Client(host=daemon.url)
    for kind in ("chat", "generate"):
        gate = Gate()

        def streamed(kind: str = kind, gate: Gate = gate) -> None:
            parts: Iterator[Any] = (
                client.chat(model="long", messages=HI, options=options, stream=True)
                if kind == "chat"
                else client.generate(model="long", prompt="hi", options=options, stream=True)
            )
            for _ in parts:
                if gate.leave.is_set():
                    parts.close()  # type: ignore[attr-defined]  # a generator: closing it closes the stream
                    return

        leaves(daemon, f"ollama {kind}, streamed", streamed, gate.leave.set)


def test_anthropic_client(daemon: Daemon) -> None:
    body: MessageCreateParamsBase = {"model": "long", "max_tokens": MAX_TOKENS, "messages": HI}
    whole = anthropic.Anthropic(base_url=daemon.url + "/anthropic", api_key="x", max_retries=0, timeout=3)
    leaves(daemon, "anthropic messages, whole", lambda: whole.messages.create(**body))
    client = anthropic.Anthropic(base_url=daemon.url + "/anthropic", api_key="x", max_retries=0)
    gate = Gate()

    def streamed() -> None:
        with client.messages.stream(**body) as stream:
            for _ in stream:
                if gate.leave.is_set():
                    return

    leaves(daemon, "anthropic messages, streamed", streamed, gate.leave.set)


def test_a_client_that_leaves_while_its_model_loads_leaves_the_queue(daemon: Daemon, tmp_path: Path) -> None:
    """It asked, then left before the runner was ready: its request is answered to nobody, and nothing is
    held for it."""
    daemon.cli("package", "--gguf", str(write_tiny_gguf(tmp_path / "other.gguf", seed=5)), "other")
    with contextlib.suppress(httpx.TimeoutException):
        httpx.post(
            daemon.url + "/v1/chat/completions",
            json={"model": "other", "messages": HI, "max_tokens": MAX_TOKENS, "ignore_eos": True},
            timeout=0.05,
        )
    wait(
        lambda: not any(r["in_use"] or r["loading"] for r in daemon.http("GET", "/engines/ps").json()),
        "no runner in use",
    )
    wait(lambda: any("model=other" in line for line in access_lines(daemon)), "its access line")
    [line] = [line for line in access_lines(daemon) if "model=other" in line]
    assert "outcome=client_left" in line and "status=499" in line, line
