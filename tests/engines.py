"""Real llama.cpp engines for tests: the installer's cached `llama-server`, and tiny models ready to serve.

`llama_server` is session-scoped and never skips: on a machine without a cached build it builds one
(~7 minutes on 2 cores, once; scripts/test does it before the tests), and if building is impossible the tests
that need it fail with the build's error. A test asks for it with a `llama_server: Path`
parameter (tests/conftest.py registers this module as a plugin); a daemon uses it through
`LLAMA_SERVER_PATH`.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from modelrunner.artifact.builder import PackageSpec, build_artifact
from modelrunner.engines import build
from modelrunner.engines.base import ModelForEngine
from modelrunner.store.sink import StoreSink
from modelrunner.store.store import ModelStore
from tests.daemon import Daemon, free_port
from tests.models import write_tiny_gguf


@pytest.fixture(scope="session")
def llama_server() -> Path:
    """Path of a working `llama-server` (b11434, CPU build) from the installer's cache."""
    return build.ensure_built(build.BuildSpec("none"), lambda line: print(line, flush=True))


def running_llama_cpp(llama_server: Path) -> str:
    """`llama.cpp b11434`, and what this CPU's proven build was made without, if anything (engines/build.py):
    the value that `Running: ...` of the engine's status carries."""
    import json

    off = build.describe_turned_off(json.loads((llama_server.parent.parent / "build.json").read_text()))
    return f"llama.cpp {build.VERSION}" + (f" ({off})" if off else "")


def packaged_model(store: ModelStore, spec: PackageSpec, tag: str) -> ModelForEngine:
    """Package spec into store under tag and describe its bundle as the scheduler would to an engine."""
    built = build_artifact(spec, StoreSink(store))
    model_id = store.add_model(built.manifest_bytes, [tag])
    model = store.get(model_id)
    config = model.config.config
    context = config.get("context_size")
    return ModelForEngine(
        id=model_id,
        reference=tag,
        bundle=store.bundle(tag),
        format=str(config.get("format", "gguf")),
        context_size=context if isinstance(context, int) else None,
        size_bytes=sum(layer.size for layer in model.manifest.layers),
    )


def tiny_model(tmp_path: Path, tag: str = "ai/tiny:latest", **spec: Any) -> ModelForEngine:
    """The tiny llama GGUF of tests/models.py, packaged into a store under tmp_path and bundled."""
    source = tmp_path / "tiny-src"
    source.mkdir(parents=True, exist_ok=True)
    gguf = write_tiny_gguf(source / "tiny.gguf")
    return packaged_model(ModelStore(tmp_path / "models"), PackageSpec(gguf=gguf, **spec), tag)


def unix_client(socket: Path, timeout: float = 60.0) -> httpx.Client:
    transport = httpx.HTTPTransport(uds=str(socket))
    return httpx.Client(transport=transport, base_url="http://localhost", timeout=timeout)


def wait_healthy(
    client: httpx.Client, process: subprocess.Popen[bytes] | None = None, timeout: float = 120.0
) -> float:
    """Poll `/health` until 200 and return the seconds it took; raise if the process exits or times out."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"llama-server exited ({process.returncode}) before it was ready")
        try:
            if client.get("/health").status_code == 200:
                return time.monotonic() - started
        except httpx.TransportError:
            pass
        time.sleep(0.01)
    raise TimeoutError(f"llama-server was not ready within {timeout:.0f} s")


@contextlib.contextmanager
def llama_daemon(home: Path, llama_server: Path) -> Iterator[Daemon]:
    """A daemon under `home` whose llama.cpp engine is the built llama-server, stopped at the end."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LLAMA_SERVER_PATH", str(llama_server))
        running = Daemon(home / "home", free_port()).start()
    try:
        yield running
    finally:
        running.stop()


@contextlib.contextmanager
def tiny_daemon(home: Path, llama_server: Path) -> Iterator[Daemon]:
    """A daemon under `home` on llama-server with the tiny model packaged as `tiny`, stopped at the end
    (the module-scoped daemon of the API tests)."""
    with llama_daemon(home, llama_server) as running:
        running.cli("package", "--gguf", str(write_tiny_gguf(home / "tiny.gguf")), "tiny")
        yield running
