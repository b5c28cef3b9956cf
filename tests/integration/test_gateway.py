"""`model gateway` (DMR's cmd/cli/commands/gateway.go and cmd/cli/docs/reference/model_gateway.md; its
server model-cli/src): the gateway as a process on a loopback port, routing one alias to a modelrunner
daemon (the fake engine) through the `docker_model_runner/` provider and others to an OpenAI-compatible
stand-in, driven by the official `openai` client."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.daemon import free_port, runner_env
from tests.fake_engine import FakeEngine
from tests.inprocess import InProcessDaemon
from tests.models import write_tiny_gguf

HI: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
KEY = "gateway-secret"


class StandIn(BaseHTTPRequestHandler):
    """An OpenAI-compatible provider that answers every chat with one text, and notes the keys it got."""

    keys: ClassVar[list[str]] = []

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        StandIn.keys.append(self.headers.get("Authorization", ""))
        answer = {
            "id": "chatcmpl-stand-in",
            "object": "chat.completion",
            "created": 1,
            "model": request["model"],
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "from the stand-in"},
                    "finish_reason": "stop",
                }
            ],
        }
        body = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def start_gateway(config: Path, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    command = [sys.executable, "-m", "modelrunner", "gateway", "-c", str(config), "--host", "127.0.0.1"]
    log = config.with_suffix(".stderr")  # a file, not a pipe no one reads: a full pipe would block it
    with open(log, "ab") as stderr:
        process = subprocess.Popen([*command, "--port", str(port)], env=env, stderr=stderr)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180  # LiteLLM's import is slow on a busy machine
    while True:
        assert process.poll() is None, log.read_text(errors="replace")
        try:
            if httpx.get(url + "/health").status_code == 200:
                return process, url
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "the gateway did not start"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    home = tmp_path_factory.mktemp("gateway")
    runner = InProcessDaemon(home / "home", {"llama.cpp": FakeEngine(env={"FAKE_CHUNKS": "3"})}).start()
    gguf = write_tiny_gguf(home / "tiny.gguf")
    packaged = runner.http("POST", "/models/package", json={"target": "tiny", "gguf": str(gguf)})
    assert packaged.status_code == 201
    stand_in = ThreadingHTTPServer(("127.0.0.1", 0), StandIn)
    threading.Thread(target=stand_in.serve_forever, daemon=True).start()
    config = home / "gateway.yaml"
    config.write_text(
        f"""
model_list:
  - model_name: local
    params:
      model: docker_model_runner/tiny
  - model_name: other
    params:
      model: openai/stand-in-model
      api_base: http://127.0.0.1:{stand_in.server_port}/v1
      api_key: os.environ/STAND_IN_KEY
  - model_name: dead
    params:
      model: openai/gone
      api_base: http://127.0.0.1:{free_port()}/v1
      api_key: unused
general_settings:
  master_key: ${{GATEWAY_KEY}}
  fallbacks:
    - dead: [other]
"""
    )
    env = runner_env(home / "home", free_port())
    # `docker_model_runner/` is the runner this CLI talks to
    env.update(MODEL_RUNNER_HOST=runner.url, STAND_IN_KEY="stand-in-secret", GATEWAY_KEY=KEY)
    process, url = start_gateway(config, env)
    yield url
    process.terminate()
    process.wait(30)
    stand_in.shutdown()
    runner.stop()


def client(url: str, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0)


def test_chat_is_routed_by_alias(gateway: str) -> None:
    """model-cli/src/router.rs: Router.chat_completion; providers/mod.rs: the key from os.environ/VAR."""
    local = client(gateway).chat.completions.create(model="local", messages=HI)
    assert local.choices[0].message.content == "t0 t1 t2 "  # the fake engine's answer, through the runner
    other = client(gateway).chat.completions.create(model="other", messages=HI)
    assert other.choices[0].message.content == "from the stand-in"
    assert StandIn.keys[-1] == "Bearer stand-in-secret"


def test_chat_streams(gateway: str) -> None:
    """model-cli/src/handlers.rs: chat_completion_handler, `stream: true` as server-sent events."""
    stream = client(gateway).chat.completions.create(model="local", messages=HI, stream=True)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert text == "t0 t1 t2 "


def test_embeddings(gateway: str) -> None:
    """model-cli/src/handlers.rs: embeddings_handler."""
    answer = client(gateway).embeddings.create(model="local", input="hi")
    assert answer.data[0].embedding == [0.1] * 8


def test_models_lists_the_aliases(gateway: str) -> None:
    """model-cli/src/router.rs: Router.list_models, sorted, owned by model-cli."""
    listed = client(gateway).models.list().data
    assert [model.id for model in listed] == ["dead", "local", "other"]
    assert {model.owned_by for model in listed} == {"model-cli"}


def test_a_dead_provider_falls_back(gateway: str) -> None:
    """model-cli/src/router.rs: run_with_retries_and_fallbacks, general_settings.fallbacks."""
    answer = client(gateway).chat.completions.create(model="dead", messages=HI)
    assert answer.choices[0].message.content == "from the stand-in"


def test_an_unknown_alias_is_404_in_openais_shape(gateway: str) -> None:
    """model-cli/src/error.rs: AppError::ModelNotFound."""
    with pytest.raises(openai.NotFoundError) as raised:
        client(gateway).chat.completions.create(model="nope", messages=HI)
    body: Any = raised.value.body
    assert body["type"] == "invalid_request_error"
    assert body["message"] == "The model 'nope' does not exist or you do not have access to it."


def test_the_master_key_is_required(gateway: str) -> None:
    """model-cli/src/auth.rs: auth_middleware, Bearer or x-api-key; /health stays open."""
    with pytest.raises(openai.AuthenticationError) as raised:
        client(gateway, "wrong").models.list()
    assert raised.value.status_code == 401
    assert httpx.get(gateway + "/v1/models", headers={"x-api-key": KEY}).status_code == 200
    assert httpx.get(gateway + "/health").json()["models"] == ["dead", "local", "other"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (None, "Failed to load config: cannot read"),
        ("model_list: [\n", "is not valid YAML"),
        ("model_list:\n  - model_name: x\n", "model_list[0].params.model is required"),
        (
            "model_list:\n  - model_name: x\n    params: {model: openai/y}\n"
            "general_settings:\n  fallbacks:\n    - x: [z]\n",
            "fallbacks name models not in model_list: z",
        ),
    ],
)
def test_a_bad_config_is_refused(tmp_path: Path, text: str | None, message: str) -> None:
    """model-cli/src/lib.rs: `Failed to load config`, exit code 1."""
    config = tmp_path / "gateway.yaml"
    if text is not None:
        config.write_text(text)
    command = [sys.executable, "-m", "modelrunner", "gateway", "--config", str(config), "--host", "127.0.0.1"]
    done = subprocess.run(
        [*command, "--port", str(free_port())],
        env=runner_env(tmp_path / "home", free_port()),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert message in done.stderr
