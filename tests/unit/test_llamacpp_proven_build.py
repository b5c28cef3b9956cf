"""A llama.cpp build is proven on this CPU before it is cached or installed (issue 35).

The compile is replaced by a stand-in step that writes a `llama-server` which, like ggml's AMX kernels on some
Sapphire Rapids machines, dies by SIGILL on every quantized model unless it was "compiled" with the AMX
instructions turned off; otherwise it answers llama-server's /health and /completion on its Unix socket.
The smoke test, the rebuild without AMX, build.json's record and install-runner's replacement of a copy that
is not the proven build all run for real around it.
"""

from __future__ import annotations

import json
import platform
import shutil
import stat
import sys
from pathlib import Path

import pytest

from modelrunner.engines import build, llamacpp_smoke
from modelrunner.engines.install import INSTALL_INFO
from modelrunner.engines.llamacpp import LlamaCppEngine
from modelrunner.errors import EngineInstallError

# argv: --version | --model M --host SOCKET ...; compiled.json beside it holds the "compiler flags".
STAND_IN = r"""
import json, os, signal, socketserver, sys
from http.server import BaseHTTPRequestHandler
from pathlib import Path
if "--version" in sys.argv:
    print("version: 0.6.0-dev (build 11434, commit unknown)", file=sys.stderr)
    sys.exit(0)
flags = json.loads((Path(sys.argv[0]).parent / "compiled.json").read_text())
model = sys.argv[sys.argv.index("--model") + 1]
print("0.00.001.000 I srv  load_model: loading model", flush=True)
if flags["die_on"] and "-mno-" + flags["die_on"] + "-tile" not in flags["extra"] and "F16" not in model:
    print("0.00.002.000 I cmn  init: llama threadpool init, n_threads = 2", flush=True)
    os.kill(os.getpid(), getattr(signal, flags["signal"]))
class Handler(BaseHTTPRequestHandler):
    def address_string(self): return "engine"
    def log_message(self, *args): pass
    def _send(self, body):
        data = json.dumps(body).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(data))); self.end_headers()
        self.wfile.write(data)
    def do_GET(self): self._send({"status": "ok"})
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self._send({"content": "abcd", "tokens_predicted": 4})
class Server(socketserver.UnixStreamServer):
    def get_request(self):
        request, _ = super().get_request()
        return request, ("engine", 0)
Server(sys.argv[sys.argv.index("--host") + 1], Handler).serve_forever()
"""


def write_stand_in(folder: Path, extra: tuple[str, ...], die_on: str | None, signal: str = "SIGILL") -> Path:
    """llama-server and ggml-rpc-server stand-ins, "compiled" with the extra flags."""
    (folder / "bin").mkdir(parents=True, exist_ok=True)
    binary = folder / "bin" / "llama-server"
    binary.write_text(f"#!{sys.executable}\n{STAND_IN}")
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    shutil.copy2(binary, folder / "bin" / "ggml-rpc-server")
    compiled = {"extra": list(extra), "die_on": die_on, "signal": signal}
    (folder / "bin" / "compiled.json").write_text(json.dumps(compiled))
    return binary


@pytest.fixture
def amx_machine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[tuple[str, ...]]:
    """An x86-64 CPU with AMX and AVX-512 extensions, an empty engine cache, and a compile step that records
    each compile's extra flags (returned) and writes a stand-in that dies on AMX."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(
        build, "cpu_flags", lambda: frozenset({"avx512f", "amx_tile", "amx_int8", "avx512_fp16"})
    )
    compiles: list[tuple[str, ...]] = []

    def fetch_source(work: Path, progress: object) -> Path:
        (work / "src").mkdir()
        return work / "src"

    def compile_stand_in(
        source: Path, build_dir: Path, spec: object, progress: object, work: Path, extra: tuple[str, ...]
    ) -> None:
        compiles.append(extra)
        write_stand_in(build_dir, extra, die_on="amx")

    monkeypatch.setattr(build, "_fetch_source", fetch_source)
    monkeypatch.setattr(build, "_compile", compile_stand_in)
    return compiles


def test_a_build_dying_by_sigill_is_rebuilt_without_amx_and_recorded(
    amx_machine: list[tuple[str, ...]],
) -> None:
    lines: list[str] = []
    spec = build.BuildSpec("none")
    binary = build.ensure_built(spec, lines.append)
    assert amx_machine == [(), ("-mno-amx-tile", "-mno-amx-int8", "-mno-amx-bf16")]
    info = json.loads((binary.parent.parent / "build.json").read_text())
    assert info["turned_off"] == [
        {
            "family": "amx",
            "compiler_flags": ["-mno-amx-tile", "-mno-amx-int8", "-mno-amx-bf16"],
            "why": "llama-server died by SIGILL on Q4_0, Q4_1, Q8_0, Q4_K models",
        }
    ]
    assert info["smoke_test"]["passed"] is True
    assert info["smoke_test"]["weight_types"] == ["Q4_0", "Q4_1", "Q8_0", "Q4_K", "F16"]
    assert build.cached_server(spec) == binary
    assert any("compiling again without amx" in line for line in lines)
    assert build.describe_turned_off(info) == (
        "built without amx (llama-server died by SIGILL on Q4_0, Q4_1, Q8_0, Q4_K models)"
    )
    # proven and cached: asked again, nothing is compiled
    assert build.ensure_built(spec, lines.append) == binary and len(amx_machine) == 2


def test_a_build_that_keeps_dying_turns_off_the_next_family_then_gives_up(
    amx_machine: list[tuple[str, ...]], monkeypatch: pytest.MonkeyPatch
) -> None:
    def always_dies(
        source: Path, build_dir: Path, spec: object, progress: object, work: Path, extra: tuple[str, ...]
    ) -> None:
        amx_machine.append(extra)
        write_stand_in(build_dir, extra, die_on="never-turned-off", signal="SIGSEGV")

    monkeypatch.setattr(build, "_compile", always_dies)
    with pytest.raises(EngineInstallError, match=r"does not run on this machine: Q4_0: died by SIGSEGV"):
        build.ensure_built(build.BuildSpec("none"), print)
    assert [len(extra) > 0 for extra in amx_machine] == [False, True, True]
    assert "-mno-avx512fp16" in amx_machine[2] and "-mno-amx-tile" in amx_machine[2]
    assert build.cached_server(build.BuildSpec("none")) is None  # nothing unproven is cached


def test_a_portable_build_is_proven_but_never_rebuilt(amx_machine: list[tuple[str, ...]]) -> None:
    with pytest.raises(EngineInstallError, match="died by SIGILL"):
        build.ensure_built(build.BuildSpec("none", portable=True), print)
    assert amx_machine == [()]


def test_a_cached_build_from_before_the_proof_is_proven_then_replaced(
    amx_machine: list[tuple[str, ...]],
) -> None:
    spec = build.BuildSpec("none")
    old = build.cache_dir(spec)
    write_stand_in(old, (), die_on="amx")
    (old / "build.json").write_text(json.dumps({"version": build.VERSION, "gpu": "none"}))
    assert build.cached_server(spec) is None  # complete, but never proven
    binary = build.ensure_built(spec, print)
    # the cached build's own smoke test showed the crash: the one compile is already without AMX
    assert amx_machine == [("-mno-amx-tile", "-mno-amx-int8", "-mno-amx-bf16")]
    assert build.cached_server(spec) == binary


def test_a_cached_build_that_passes_is_proven_in_place(amx_machine: list[tuple[str, ...]]) -> None:
    spec = build.BuildSpec("none")
    old = build.cache_dir(spec)
    write_stand_in(old, (), die_on=None)
    (old / "build.json").write_text(json.dumps({"version": build.VERSION, "gpu": "none"}))
    assert build.ensure_built(spec, print) == old / "bin" / "llama-server"
    assert amx_machine == []  # nothing compiled
    assert build.is_proven(build.build_info(spec))


def test_install_runner_replaces_a_copy_that_is_not_the_proven_build(
    amx_machine: list[tuple[str, ...]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LLAMA_SERVER_PATH", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    engine = LlamaCppEngine(install_root=tmp_path / "engines" / "llama.cpp")
    # a copy installed before builds were proven: the crashing native build, no build_id
    installed = engine.install_root / build.VERSION
    write_stand_in(installed, (), die_on="amx")
    (installed / INSTALL_INFO).write_text(json.dumps({"version": build.VERSION, "gpu": "none"}))
    lines: list[str] = []
    status = engine.install(lines.append, gpu="none")
    assert any("not this machine's proven build" in line for line in lines)
    info = json.loads((installed / INSTALL_INFO).read_text())
    assert info["build_id"] == build.build_info(build.BuildSpec("none"))["build_id"]
    assert info["turned_off"][0]["family"] == "amx"
    assert status.describe("llama.cpp").startswith("Running: llama.cpp b11434 (built without amx (")
    lines.clear()
    engine.install(lines.append, gpu="none")
    assert any("already installed" in line for line in lines)
    # a newer proven build in the cache (e.g. rebuilt after a CPU change): the copy is stale
    cache_info = build.build_info(build.BuildSpec("none"))
    cache_info["build_id"] = "newer"
    (build.cache_dir(build.BuildSpec("none")) / "build.json").write_text(json.dumps(cache_info))
    engine.install(lines.append, gpu="none")
    assert json.loads((installed / INSTALL_INFO).read_text())["build_id"] == "newer"


def test_the_smoke_models_load_their_weight_types(tmp_path: Path) -> None:
    import gguf

    for weight_type in llamacpp_smoke.WEIGHT_TYPES:
        path = llamacpp_smoke.write_smoke_model(tmp_path / f"{weight_type}.gguf", weight_type)
        tensors = {t.name: t for t in gguf.GGUFReader(path).tensors}
        assert tensors["blk.0.ffn_down.weight"].tensor_type.name == weight_type
        assert [int(n) for n in tensors["blk.0.ffn_down.weight"].shape] == [512, 256]
        assert tensors["output_norm.weight"].tensor_type.name == "F32"
