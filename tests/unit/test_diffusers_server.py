"""The diffusers server's torch-free parts, in the project venv: request checks, DDUF unpacking, HTTP app.

The app is driven with a stand-in pipeline; the real pipeline is exercised in
tests/integration/test_diffusers_inference.py.
"""

from __future__ import annotations

import base64
import threading
import zipfile
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from modelrunner.engines.diffusers_server.app import ServerState, build_app
from modelrunner.engines.diffusers_server.dduf import COMPLETE_MARK, BadDDUF, unpack
from modelrunner.engines.diffusers_server.params import (
    BadParameter,
    ImageRequest,
    WrongModel,
    canonical_name,
    check_model,
    parse_request,
    parse_size,
)
from tests.models import write_dduf_with_compressed_entry, write_dduf_with_entry_name, write_tiny_dduf

# -- request fields ------------------------------------------------------------------------------------


def test_defaults_follow_dmr() -> None:
    assert parse_request({"prompt": "a cat"}) == ImageRequest(
        prompt="a cat", n=1, width=512, height=512, num_inference_steps=50, guidance_scale=7.5, seed=None
    )


def test_every_field_is_read() -> None:
    body = {
        "prompt": "a cat",
        "n": 3,
        "size": "64x128",
        "negative_prompt": "dogs",
        "num_inference_steps": 2,
        "guidance_scale": 1,
        "seed": 7,
        "response_format": "b64_json",
        "quality": "hd",  # accepted and ignored, as DMR does
        "style": "vivid",
    }
    assert parse_request(body) == ImageRequest("a cat", 3, 64, 128, "dogs", 2, 1.0, 7)


@pytest.mark.parametrize(
    ("size", "problem"),
    [
        ("65x64", "multiple of 8"),
        ("56x64", "multiple of 8"),
        ("64x4096", "multiple of 8"),
        ("64", "look like"),
        ("64X64", "look like"),
        (" 64x64", "look like"),
        ("-64x64", "look like"),
        (64, "look like"),
    ],
)
def test_bad_sizes(size: object, problem: str) -> None:
    with pytest.raises(BadParameter, match=problem):
        parse_size(size)


@pytest.mark.parametrize(
    ("field", "value", "problem"),
    [
        ("n", 0, "n must be from 1 to 10"),
        ("n", 11, "n must be from 1 to 10"),
        ("n", 1.5, "n must be an integer"),
        ("n", True, "n must be an integer"),
        ("num_inference_steps", 0, "from 1 to 150"),
        ("num_inference_steps", 151, "from 1 to 150"),
        ("guidance_scale", 0.5, "from 1 to 20"),
        ("guidance_scale", 21, "from 1 to 20"),
        ("guidance_scale", "7", "must be a number"),
        ("seed", -1, "seed must be from 0"),
        ("seed", "1", "seed must be an integer"),
        ("response_format", "url", "b64_json"),
        ("negative_prompt", 3, "negative_prompt must be a string"),
        ("prompt", "", "prompt is required"),
        ("prompt", ["a"], "prompt is required"),
    ],
)
def test_bad_values(field: str, value: object, problem: str) -> None:
    with pytest.raises(BadParameter, match=problem):
        parse_request({"prompt": "a cat", field: value})


def test_body_must_be_an_object() -> None:
    with pytest.raises(BadParameter, match="JSON object"):
        parse_request(["a cat"])


def test_model_names_compare_as_dmr_reads_them() -> None:
    served = ("ai/tiny:latest", "sha256:" + "a" * 64)
    for name in ("tiny", "ai/tiny", "tiny:latest", "docker.io/ai/tiny", "index.docker.io/ai/tiny:latest"):
        check_model(name, served)
    check_model("sha256:" + "a" * 64, served)
    assert canonical_name("hf.co/org/x:latest") == "hf.co/org/x"
    for other in ("tiny:v2", "other/tiny", "tinyx"):
        with pytest.raises(WrongModel):
            check_model(other, served)
    with pytest.raises(BadParameter, match="model is required"):
        check_model(None, served)


# -- DDUF unpacking ------------------------------------------------------------------------------------


def test_unpack_writes_every_entry_once_and_reuses_it(tmp_path: Path) -> None:
    dduf = write_tiny_dduf(tmp_path / "pipe.dduf")
    folder = unpack(dduf, tmp_path / "cache")
    assert (folder / "model_index.json").is_file()
    assert (folder / "vae" / "diffusion_pytorch_model.safetensors").is_file()
    assert (folder / COMPLETE_MARK).is_file()
    (folder / "model_index.json").write_text("{}")  # a second unpack must not touch a finished folder
    assert unpack(dduf, tmp_path / "cache") == folder
    assert (folder / "model_index.json").read_text() == "{}"
    assert [p.name for p in (tmp_path / "cache").iterdir()] == ["pipe.dduf"]  # no staging folder left


def test_a_folder_left_without_its_mark_is_replaced(tmp_path: Path) -> None:
    dduf = write_tiny_dduf(tmp_path / "pipe.dduf")
    half = tmp_path / "cache" / "pipe.dduf"
    half.mkdir(parents=True)
    (half / "junk").write_text("from a crash")
    folder = unpack(dduf, tmp_path / "cache")
    assert not (folder / "junk").exists() and (folder / COMPLETE_MARK).is_file()


@pytest.mark.parametrize(
    ("writer", "problem"),
    [
        (write_dduf_with_compressed_entry, "is compressed"),
        (lambda p: write_dduf_with_entry_name(p, "../x.json"), "not a clean relative path"),
        (lambda p: write_dduf_with_entry_name(p, "a/../../x"), "not a clean relative path"),
        (lambda p: write_dduf_with_entry_name(p, "/etc/x.json"), "absolute"),
        (lambda p: write_dduf_with_entry_name(p, "a\\..\\x"), "backslash"),
        (lambda p: write_dduf_with_entry_name(p, "x\x00.json"), "NUL"),
    ],
)
def test_hostile_archives_write_nothing(tmp_path: Path, writer: object, problem: str) -> None:
    assert callable(writer)
    dduf = writer(tmp_path / "bad.dduf")
    with pytest.raises(BadDDUF, match=problem):
        unpack(dduf, tmp_path / "cache")
    assert not any((tmp_path / "cache").rglob("*"))
    assert not (tmp_path / "x.json").exists()


def test_a_damaged_entry_is_refused_and_cleaned_up(tmp_path: Path) -> None:
    dduf = write_tiny_dduf(tmp_path / "pipe.dduf")
    data = bytearray(dduf.read_bytes())
    where = data.index(b'"_class_name"')  # inside model_index.json's stored bytes: its CRC no longer matches
    data[where + 1] ^= 0x20
    dduf.write_bytes(bytes(data))
    with pytest.raises(BadDDUF, match="damaged"):
        unpack(dduf, tmp_path / "cache")
    assert not any((tmp_path / "cache").rglob("*"))


def test_not_a_zip_and_no_index(tmp_path: Path) -> None:
    junk = tmp_path / "junk.dduf"
    junk.write_bytes(b"not a zip at all")
    with pytest.raises(BadDDUF, match="not a readable ZIP"):
        unpack(junk, tmp_path / "cache")
    no_index = tmp_path / "no-index.dduf"
    with zipfile.ZipFile(no_index, "w") as zf:
        zf.writestr("vae/config.json", "{}")
    with pytest.raises(BadDDUF, match=r"no model_index\.json"):
        unpack(no_index, tmp_path / "cache")


# -- the HTTP app, with a stand-in pipeline -------------------------------------------------------------


class FakePipeline:
    def __init__(self) -> None:
        self.requests: list[ImageRequest] = []

    def generate(self, request: ImageRequest, cancelled: threading.Event) -> list[bytes]:
        self.requests.append(request)
        return [b"\x89PNG\r\n\x1a\n" + bytes([i]) for i in range(request.n)]


def test_health_is_503_while_loading_then_200() -> None:
    state = ServerState(served_names=("ai/tiny:latest",))
    client = TestClient(build_app(state))
    loading = client.get("/health")
    assert loading.status_code == 503 and loading.json() == {"status": "loading", "model_loaded": False}
    body = {"model": "tiny", "prompt": "a cat"}
    assert client.post("/v1/images/generations", json=body).status_code == 503
    state.pipeline = FakePipeline()
    assert client.get("/health").json() == {"status": "healthy", "model_loaded": True}
    assert client.get("/v1/models").json()["data"][0]["id"] == "ai/tiny:latest"


def test_generations_answer_b64_pngs_and_map_errors() -> None:
    fake = FakePipeline()
    client = TestClient(build_app(ServerState(served_names=("ai/tiny:latest",), pipeline=fake)))
    ok = client.post("/v1/images/generations", json={"model": "tiny", "prompt": "a cat", "n": 2, "seed": 5})
    assert ok.status_code == 200
    images = [base64.b64decode(item["b64_json"]) for item in ok.json()["data"]]
    assert images == [b"\x89PNG\r\n\x1a\n\x00", b"\x89PNG\r\n\x1a\n\x01"]
    assert fake.requests[0].seed == 5 and fake.requests[0].n == 2

    other = client.post("/v1/images/generations", json={"model": "other", "prompt": "a cat"})
    assert other.status_code == 421 and other.json()["error"]["code"] == 421
    bad = client.post("/v1/images/generations", json={"model": "tiny", "prompt": "x", "size": "63x64"})
    assert bad.status_code == 400 and "multiple of 8" in bad.json()["error"]["message"]
    url_body = {"model": "tiny", "prompt": "x", "response_format": "url"}
    url = client.post("/v1/images/generations", json=url_body)
    assert url.status_code == 400
    junk = client.post("/v1/images/generations", content=b"{not json")
    assert junk.status_code == 400
    assert len(fake.requests) == 1  # nothing invalid reached the pipeline


def test_a_pipeline_failure_is_a_500_and_the_server_stays_up() -> None:
    class Broken:
        def generate(self, request: ImageRequest, cancelled: threading.Event) -> list[bytes]:
            raise RuntimeError("out of memory")

    client = TestClient(build_app(ServerState(served_names=("tiny",), pipeline=Broken())))
    failed = client.post("/v1/images/generations", json={"model": "tiny", "prompt": "a cat"})
    assert failed.status_code == 500 and "out of memory" in failed.json()["error"]["message"]
    assert client.get("/health").status_code == 200
