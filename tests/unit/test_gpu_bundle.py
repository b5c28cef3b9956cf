"""bench/gpu_bundle.py, the GPU run's offline path (issue #35): the llama.cpp source trimmed of what no
CUDA build reads (and nothing it does), the host's own packages left out of the wheels, and a venv made
from a python that is itself a venv (the GPU host's is) seeing that venv's packages (torch there)."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

from bench.gpu_bundle import HOST_PACKAGES, make_venv, normal, trim, wheel_name


def write(path: Path, text: str = "x") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_trim_keeps_what_the_cuda_build_reads_and_drops_the_rest(tmp_path: Path) -> None:
    kept = [
        "CMakeLists.txt",
        "LICENSE",
        "ggml/src/ggml-cuda/mmq.cu",
        "ggml/src/ggml-cuda/CMakeLists.txt",
        "ggml/src/ggml-cpu/ggml-cpu.c",
        "ggml/src/ggml-rpc/ggml-rpc.cpp",
        "tools/server/server.cpp",
        "tools/ui/CMakeLists.txt",
        "tools/ui/ui.cpp.in",
        "scripts/ui-assets.cmake",
        "ggml/src/ggml-cuda/template-instances/generate_cu_files.py",  # not at the top: a helper stays
        "vendor/cpp-httplib/httplib.h",
    ]
    dropped = [
        "docs/build.md",
        "models/ggml-vocab-llama.gguf",
        "tests/test-backend-ops.cpp",
        "examples/simple/simple.cpp",
        "ggml/src/ggml-vulkan/ggml-vulkan.cpp",
        "ggml/src/ggml-metal/ggml-metal.m",
        "ggml/src/ggml-sycl/ggml-sycl.cpp",
        "tools/ui/src/app.svelte",
        "tools/server/tests/unit/test_basic.py",
        "convert_hf_to_gguf.py",
        "README.md",
        "tools/server/README.md",
    ]
    for name in kept + dropped:
        write(tmp_path / name)
    assert trim(tmp_path) == len(dropped)
    left = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert left == sorted(kept)


def test_the_hosts_packages_are_named_as_pip_names_wheels() -> None:
    assert wheel_name(Path("huggingface_hub-2.4.0-py3-none-any.whl")) == ("huggingface-hub", "2.4.0")
    assert normal("Typing_Extensions") == "typing-extensions"
    assert {"torch", "numpy", "httpx", "huggingface-hub", "uvloop"} <= HOST_PACKAGES
    # what the daemon needs and the host lacks is brought
    assert not {"fastapi", "uvicorn", "pydantic", "diffusers", "gguf"} & HOST_PACKAGES


def test_a_venv_made_from_a_venv_python_sees_its_packages(tmp_path: Path) -> None:
    host = tmp_path / "host"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(host)], check=True)
    site = sysconfig.get_path("purelib", vars={"base": str(host), "platbase": str(host)})
    write(Path(site) / "host_only_package.py", "WHERE = 'host'\n")
    made = make_venv(str(host / "bin" / "python"), tmp_path / "venv")
    probe = "import host_only_package, sys; print(host_only_package.WHERE, sys.prefix)"
    out = subprocess.run([str(made), "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["host", str(tmp_path / "venv")]
