"""Model routes decoded as DMR's CLI decodes them.

Follows: `cmd/cli/desktop/desktop.go` (List, Inspect, InspectOpenAI, Remove, Tag, RepackageModel,
ServerVersion, DF, Pull/Push with `DisplayProgress`), `cmd/cli/desktop/progress.go` (lines HTML-unescaped,
then decoded as `oci.ProgressMessage`), `pkg/inference/models/api.go` (Model, OpenAIModelList),
`pkg/distribution/distribution/client.go` (DeleteModelResponse), `pkg/inference/scheduling/api.go`
(DiskUsage).
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conformance.dmr_daemons import package
from tests.conformance.gotypes import (
    DELETE_RESPONSE,
    DISK_USAGE,
    MODEL,
    PROGRESS_MESSAGE,
    SERVER_VERSION,
    go_decode,
)
from tests.inprocess import InProcessDaemon
from tests.models import write_tiny_dduf
from tests.registry import Registry

UA = {"User-Agent": "docker-model-cli/v1.2.6"}
OPENAI_MODEL = {
    "id": "string",
    "object": "string",
    "created": "int",
    "owned_by": "string",
    "dmr": {
        "context_window": "int",
        "architecture": "string",
        "parameters": "string",
        "quantization": "string",
        "size": "string",
    },
}


def test_list_inspect_version_df_decode(fake_daemon: InProcessDaemon) -> None:
    daemon = fake_daemon
    models = daemon.http("GET", "/models", headers=UA)
    go_decode(models.json(), [MODEL])
    inspected = daemon.http("GET", "/models/tiny", headers=UA)
    go_decode(inspected.json(), MODEL)
    listing = daemon.http("GET", "/engines/v1/models", headers=UA).json()
    go_decode(listing, {"object": "string", "data": [OPENAI_MODEL]})
    assert listing["object"] == "list" and listing["data"][0]["owned_by"] == "docker"
    go_decode(daemon.http("GET", "/engines/v1/models/ai/tiny", headers=UA).json(), OPENAI_MODEL)
    go_decode(daemon.http("GET", "/version", headers=UA).json(), SERVER_VERSION)
    usage = daemon.http("GET", "/engines/df", headers=UA).json()
    go_decode(usage, DISK_USAGE)
    assert usage["models_disk_usage"] > 0
    assert listing["data"][0]["dmr"]["context_window"] == 512  # the GGUF's, as DMR's packaging keeps it
    # DMR's Inspect: a 404 is "model not found"
    assert daemon.http("GET", "/models/absent", headers=UA).status_code == 404


def test_the_dmr_block_leaves_out_what_a_model_does_not_say(
    fake_daemon: InProcessDaemon, tmp_path: Path
) -> None:
    """api.go DMRMetadata: every field `omitempty`; a diffusers model has no context window (nor a
    quantization), so its `dmr` block does not name one (it said `null`)."""
    dduf = write_tiny_dduf(tmp_path / "tiny.dduf")
    packaged = fake_daemon.http("POST", "/models/package", json={"target": "ai/pictures", "dduf": str(dduf)})
    assert packaged.status_code == 201, packaged.text
    shown = fake_daemon.http("GET", "/engines/v1/models/ai/pictures").json()
    assert "context_window" not in shown["dmr"]
    assert all(value not in (None, "") for value in shown["dmr"].values()), shown["dmr"]


def test_tag_repackage_rm_as_dmr_s_cli_sends_them(fake_daemon: InProcessDaemon) -> None:
    daemon = fake_daemon
    # Tag: POST with no body, the target in the query; DMR's CLI expects 201
    tagged = daemon.http("POST", "/models/tiny/tag?repo=myorg/tiny&tag=v1", headers=UA)
    assert tagged.status_code == 201, tagged.text
    # RepackageModel: {"target": ..., "context_size": N} with Content-Type application/json
    body = b'{"target":"myorg/tiny:small","context_size":128}'
    repackaged = daemon.http(
        "POST", "/models/tiny/repackage", content=body, headers={**UA, "Content-Type": "application/json"}
    )
    assert repackaged.status_code == 201, repackaged.text  # handleRepackageModel: StatusCreated
    assert repackaged.json() == {
        "message": 'Model repackaged successfully as "myorg/tiny:small"',
        "source": "tiny",
        "target": "myorg/tiny:small",
    }
    # Remove: DELETE ...?force=false, 200 and DeleteModelResponse
    removed = daemon.http("DELETE", "/models/myorg/tiny:v1?force=false", headers=UA)
    assert removed.status_code == 200
    go_decode(removed.json(), DELETE_RESPONSE)
    assert removed.json() == [{"Untagged": "docker.io/myorg/tiny:v1"}]
    assert daemon.http("DELETE", "/models/absent?force=false", headers=UA).status_code == 404


@pytest.fixture
def registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Registry]:
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker-empty"))
    running = Registry(tmp_path / "registry").start()
    yield running
    running.stop()


def progress_lines(text: str) -> list[dict[str, object]]:
    """DisplayProgress: each line HTML-unescaped, then decoded as oci.ProgressMessage."""
    messages = []
    for line in text.splitlines():
        if line:
            message = json.loads(html.unescape(line))
            go_decode(message, PROGRESS_MESSAGE)
            messages.append(message)
    return messages


def test_pull_and_push_progress_lines_decode(
    fake_daemon: InProcessDaemon, registry: Registry, tmp_path: Path
) -> None:
    daemon = fake_daemon
    ref = f"{registry.host}/conformance/tiny:v1"
    package(daemon, tmp_path, ref, seed=5)
    # Push: POST with no body (no HF token), no Accept: DMR's CLI gets text/plain, HTML-escaped
    pushed = daemon.http("POST", f"/models/{ref}/push", headers=UA, timeout=120)
    assert pushed.status_code == 200 and pushed.headers["content-type"].startswith("text/plain")
    pushes = progress_lines(pushed.text)
    assert pushes[-1]["type"] == "success" and {m["mode"] for m in pushes} == {"push"}

    daemon.http("DELETE", f"/models/{ref}").raise_for_status()
    body = json.dumps({"from": ref}).encode()  # ModelCreateRequest; bearer-token omitted when empty
    pulled = daemon.http(
        "POST",
        "/models/create",
        content=body,
        headers={**UA, "Content-Type": "application/json"},
        timeout=120,
    )
    assert pulled.status_code == 200
    pulls = progress_lines(pulled.text)
    assert pulls[-1] == {
        **pulls[-1],
        "type": "success",
        "message": "Model pulled successfully",
        "mode": "pull",
    }
    layers = [
        m for m in pulls if m["type"] == "progress" and isinstance(m["layer"], dict) and m["layer"].get("id")
    ]
    assert layers and all(isinstance(m["total"], int) for m in layers)
