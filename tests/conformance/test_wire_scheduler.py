"""The scheduler routes as DMR's CLI and Compose provider use them: requests built byte for byte as
`encoding/json` marshals DMR's Go structs, answers decoded with DMR's field names and Go types.

Follows: `pkg/inference/scheduling/api.go` (BackendStatus, UnloadRequest, ConfigureRequest,
ModelConfigEntry), `pkg/inference/backend.go` (BackendConfiguration, KeepAlive), `cmd/cli/desktop/desktop.go`
(PS, Unload, ConfigureBackend, ShowConfigs), `cmd/cli/commands/unload.go`, `purge.go`, `configure_flags.go`,
`compose.go`, `pkg/inference/scheduling/loader.go` (Unload: `""` means every backend).
"""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from modelrunner.engines.llamacpp import LlamaCppEngine
from modelrunner.engines.vllm import VllmEngine
from tests.conformance.dmr_daemons import FakeDaemons
from tests.conformance.gotypes import (
    BACKEND_STATUS,
    MODEL_CONFIG_ENTRY,
    UNLOAD_RESPONSE,
    go_decode,
    go_keep_alive_ok,
    go_time,
)
from tests.inprocess import InProcessDaemon
from tests.models import write_tiny_safetensors_dir

DMR_CLI = {"Content-Type": "application/json", "User-Agent": "docker-model-cli/v1.2.6"}


def send(daemon: InProcessDaemon, method: str, path: str, body: str | None = None) -> httpx.Response:
    """A request as DMR's CLI sends it: its exact body bytes, its headers."""
    headers = DMR_CLI if body is not None else {"User-Agent": DMR_CLI["User-Agent"]}
    content = body.encode() if body is not None else None
    return daemon.http(method, path, content=content, headers=headers)


def chat(daemon: InProcessDaemon, model: str = "tiny") -> None:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    assert daemon.http("POST", "/engines/v1/chat/completions", json=body).status_code == 200


def test_ps_decodes_as_backend_status(fake_daemon: InProcessDaemon) -> None:
    chat(fake_daemon)
    response = send(fake_daemon, "GET", "/engines/ps")
    [runner] = response.json()
    go_decode(response.json(), [BACKEND_STATUS])
    assert runner["backend_name"] == "llama.cpp" and runner["model_name"] == "tiny"
    assert runner["mode"] == "completion" and runner["in_use"] is False and runner["loading"] is False
    assert runner["keep_alive"] == "5m0s"  # KeepAlive.MarshalJSON: time.Duration.String()
    age = datetime.now(UTC) - go_time(runner["last_used"])
    assert 0 <= age.total_seconds() < 120


def test_ps_while_a_runner_is_in_use_has_go_s_zero_time(fake_daemons: FakeDaemons) -> None:
    """DMR reports LastUsed only for idle runners (`scheduler.go: getLoaderStatus`): a zero time.Time."""
    daemon = fake_daemons.start({"FAKE_CHUNKS": "40", "FAKE_CHUNK_DELAY": "0.1"})
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    streaming = threading.Thread(
        target=lambda: daemon.http("POST", "/engines/v1/chat/completions", json=body), daemon=True
    )
    streaming.start()
    daemon.wait_for(lambda: any(r["in_use"] for r in daemon.ps()), "the runner to be in use")
    [runner] = daemon.ps()
    go_decode([runner], [BACKEND_STATUS])
    assert runner["last_used"] == "0001-01-01T00:00:00Z"
    streaming.join(60)


def test_keep_alive_forever_is_minus_one(fake_daemon: InProcessDaemon) -> None:
    # `model configure --keep-alive -1 tiny` as DMR's CLI marshals it: KeepAliveForever -> "-1"
    assert (
        send(fake_daemon, "POST", "/engines/_configure", '{"model":"tiny","keep_alive":"-1"}').status_code
        == 202
    )
    fake_daemon.wait_for(lambda: fake_daemon.ps() != [], "the configured model to preload")
    [runner] = fake_daemon.ps()
    assert runner["keep_alive"] == "-1" and go_keep_alive_ok(runner["keep_alive"])


def test_unload_all_as_dmr_s_cli_and_purge_send_it(fake_daemon: InProcessDaemon) -> None:
    chat(fake_daemon)
    response = send(fake_daemon, "POST", "/engines/unload", '{"all":true,"backend":"","models":null}')
    assert response.status_code == 200, response.text
    go_decode(response.json(), UNLOAD_RESPONSE)
    assert response.json() == {"unloaded_runners": 1}
    assert fake_daemon.ps() == []


@pytest.mark.parametrize("name", ["tiny", "ai/tiny", "ai/tiny:latest", "index.docker.io/ai/tiny:latest"])
def test_unload_by_name_as_typed(fake_daemon: InProcessDaemon, name: str) -> None:
    """`docker model unload tiny`: `{"all":false,"backend":"","models":["tiny"]}`; "" is every backend."""
    chat(fake_daemon)
    body = json.dumps({"all": False, "backend": "", "models": [name]}, separators=(",", ":"))
    response = send(fake_daemon, "POST", "/engines/unload", body)
    assert response.json() == {"unloaded_runners": 1}, response.text
    assert fake_daemon.ps() == []


def test_unload_by_id_and_by_backend(fake_daemon: InProcessDaemon) -> None:
    chat(fake_daemon)
    model_id = fake_daemon.http("GET", "/models/tiny").json()["id"]
    other = send(fake_daemon, "POST", "/engines/unload", '{"all":false,"backend":"vllm","models":["tiny"]}')
    assert other.json() == {"unloaded_runners": 0}
    short = json.dumps({"all": False, "backend": "llama.cpp", "models": [model_id[7:19]]})
    assert send(fake_daemon, "POST", "/engines/unload", short).json() == {"unloaded_runners": 1}
    absent = send(fake_daemon, "POST", "/engines/unload", '{"all":false,"backend":"","models":["absent"]}')
    assert absent.json() == {"unloaded_runners": 0}


def test_unload_needs_models_or_all(fake_daemon: InProcessDaemon) -> None:
    response = send(fake_daemon, "POST", "/engines/unload", '{"all":false,"backend":"","models":null}')
    assert response.status_code == 400 and "name the models to unload" in response.text


def test_configure_as_dmr_s_cli_sends_it_and_show_in_its_shape(fake_daemon: InProcessDaemon) -> None:
    """`docker model configure --context-size 2048 --keep-alive 10m --think=false tiny -- --fake-x 2`"""
    body = (
        '{"model":"tiny","context-size":2048,"runtime-flags":["--fake-x","2"],"keep_alive":"10m0s",'
        '"llamacpp":{"reasoning-budget":0}}'
    )
    assert send(fake_daemon, "POST", "/engines/_configure", body).status_code == 202
    shown = send(fake_daemon, "GET", "/engines/_configure?model=tiny").json()
    go_decode(shown, [MODEL_CONFIG_ENTRY])
    model_id = fake_daemon.http("GET", "/models/tiny").json()["id"]
    assert shown == [
        {
            "Backend": "llama.cpp",
            "Model": "docker.io/ai/tiny:latest",
            "ModelID": model_id,
            "Mode": "completion",
            "Config": {
                "context-size": 2048,
                "runtime-flags": ["--fake-x", "2"],
                "keep_alive": "10m0s",
                "llamacpp": {"reasoning-budget": 0},
            },
        }
    ]
    # an unknown model filters everything out, as DMR's ResolveID does
    assert send(fake_daemon, "GET", "/engines/_configure?model=absent").json() == []


def test_configure_as_compose_sends_it(fake_daemon: InProcessDaemon) -> None:
    """`compose up --model tiny --context-size 4096 --runtime-flags "--fake-threads 2"` (compose.go): the
    raw string is split as a shell would; mode embedding from `--embeddings` is DMR's rule too."""
    body = '{"model":"tiny","raw-runtime-flags":"--fake-threads 2","context-size":4096}'
    assert send(fake_daemon, "POST", "/engines/_configure", body).status_code == 202
    [entry] = fake_daemon.http("GET", "/engines/_configure").json()
    assert entry["Config"] == {"context-size": 4096, "runtime-flags": ["--fake-threads", "2"]}
    mode = '{"model":"tiny","mode":"embedding","keep_alive":"0s"}'
    assert send(fake_daemon, "POST", "/engines/_configure", mode).status_code == 202
    modes = {e["Mode"]: e["Config"] for e in fake_daemon.http("GET", "/engines/_configure").json()}
    assert modes["embedding"] == {"keep_alive": "0s"}


BAD_CONFIGURES = [
    # issue 12: an unbalanced quote was a plain-text 500 (shlex.split unguarded)
    ('{"model":"tiny","raw-runtime-flags":"--fake-threads \\"2"}', "invalid raw-runtime-flags"),
    # keep_alive: NaN, infinities, negatives other than -1, longer than a Go duration, not a duration
    ('{"model":"tiny","keep_alive":NaN}', "keep_alive"),
    ('{"model":"tiny","keep_alive":Infinity}', "keep_alive"),
    ('{"model":"tiny","keep_alive":-Infinity}', "keep_alive"),
    ('{"model":"tiny","keep_alive":-5}', "may not be negative"),
    ('{"model":"tiny","keep_alive":"-5m"}', "may not be negative"),
    ('{"model":"tiny","keep_alive":1e300}', "at most 292 years"),
    ('{"model":"tiny","keep_alive":"3000000h"}', "at most 292 years"),
    ('{"model":"tiny","keep_alive":"soon"}', "keep_alive"),
    ('{"model":"tiny","keep_alive":"NaN"}', "keep_alive"),
    ('{"model":"tiny","context-size":0}', "context-size"),
    ('{"model":"tiny","llamacpp":{"reasoning-budget":-2}}', "reasoning-budget"),
]


@pytest.mark.parametrize(("body", "why"), BAD_CONFIGURES)
def test_bad_configure_requests_are_400s_and_store_nothing(
    fake_daemon: InProcessDaemon, body: str, why: str
) -> None:
    response = send(fake_daemon, "POST", "/engines/_configure", body)
    assert response.status_code == 400, response.text
    assert response.headers["content-type"] == "text/plain; charset=utf-8"  # http.Error's, as DMR's
    assert why in response.text
    assert fake_daemon.http("GET", "/engines/_configure").json() == []
    assert fake_daemon.ps() == []


@pytest.fixture
def real_flag_rules(fake_daemons: FakeDaemons, tmp_path: Path) -> InProcessDaemon:
    """The real llama.cpp and vLLM engines (not installed: nothing is started), for their flag rules."""
    engines: dict[str, Any] = {
        "llama.cpp": LlamaCppEngine(tmp_path / "no-llama"),
        "vllm": VllmEngine(tmp_path / "no-vllm"),
    }
    daemon = fake_daemons.start(engines=engines)
    folder = write_tiny_safetensors_dir(tmp_path / "st")
    packaged = daemon.http("POST", "/models/package", json={"target": "st", "safetensors_dir": str(folder)})
    assert packaged.status_code == 201, packaged.text
    return daemon


@pytest.mark.parametrize(
    ("model", "flags", "why"),
    [
        ("tiny", ["--api-key", "secret"], "who may reach the engine"),
        ("tiny", ["--api-key-file", "keys"], "who may reach the engine"),
        ("tiny", ["--ssl-key-file", "k.pem"], "who may reach the engine"),
        ("tiny", ["--ssl-cert-file", "c.pem"], "who may reach the engine"),
        ("tiny", ["--host", "0.0.0.0"], "who may reach the engine"),
        ("tiny", ["--port", "8080"], "who may reach the engine"),
        ("tiny", ["--api-prefix", "v2"], "who may reach the engine"),
        ("tiny", ["--path", "www"], "read or write files"),
        ("tiny", ["--media-path", "pics"], "read or write files"),
        ("tiny", ["--props"], "settings for every client"),
        ("st", ["--api-key", "secret"], "who may reach the engine"),
        ("st", ["--port", "1"], "who may reach the engine"),
        ("st", ["--allowed-local-media-path", "x"], "read files"),
    ],
)
def test_flags_that_change_the_engine_s_access_rules_are_refused(
    real_flag_rules: InProcessDaemon, model: str, flags: list[str], why: str
) -> None:
    for body in (
        {"model": model, "runtime-flags": flags},
        {"model": model, "raw-runtime-flags": " ".join(flags)},
    ):
        response = real_flag_rules.http("POST", "/engines/_configure", json=body)
        assert response.status_code == 400, response.text
        message = response.text
        assert flags[0] in message and why in message
    assert real_flag_rules.http("GET", "/engines/_configure").json() == []


def test_ordinary_flags_still_pass(real_flag_rules: InProcessDaemon) -> None:
    body = {"model": "tiny", "runtime-flags": ["--threads", "2", "--temp", "0.7"]}
    assert real_flag_rules.http("POST", "/engines/_configure", json=body).status_code == 202
    [entry] = real_flag_rules.http("GET", "/engines/_configure").json()
    assert entry["Config"]["runtime-flags"] == ["--threads", "2", "--temp", "0.7"]


def test_keep_alive_is_written_as_go_writes_durations() -> None:
    """KeepAlive.MarshalJSON (pkg/inference/backend.go): time.Duration.String(), "-1" for forever."""
    from modelrunner.scheduler.durations import NEVER, format_keep_alive

    cases = {0: "0s", 0.25: "250ms", 1.5: "1.5s", 90: "1m30s", 300: "5m0s", 3600: "1h0m0s", 5400: "1h30m0s"}
    cases |= {86400: "24h0m0s", 2.5e-6: "2.5µs", 7e-9: "7ns", NEVER: "-1"}
    assert {seconds: format_keep_alive(seconds) for seconds in cases} == cases
    assert all(go_keep_alive_ok(text) for text in cases.values())
