"""scripts/gpu-check --bundle, then its offline install (issue #35): what an air-gapped GPU host needs fits
the 55 MiB, leaves out what the host has, holds llama.cpp's source trimmed for a CUDA build (configured here
with the CPU recipe by the bundle step itself), and installs with no index into a fresh venv over a stand-in
of the host, where the daemon, the run's own script and the diffusers engine's environment import. A new
dependency that has no wheel for the host's Python fails here, not on the GPU host."""

from __future__ import annotations

import json
import subprocess
import tarfile
from pathlib import Path

from bench.gpu_bundle import HOST_PACKAGES, LIMIT_BYTES, wheel_name

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = str(ROOT / "scripts" / "gpu-check")


def test_the_bundle_fits_and_installs_with_no_index(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    made = subprocess.run([SCRIPT, "--bundle", str(bundle)], capture_output=True, text=True, timeout=900)
    assert made.returncode == 0, made.stdout[-2000:] + made.stderr[-3000:]
    manifest = json.loads((bundle / "bundle.json").read_text())
    assert manifest["bytes"] <= LIMIT_BYTES and "MiB (limit 55 MiB)" in made.stdout

    wheels = {wheel_name(Path(name))[0] for name in manifest["wheels"]}
    assert {"fastapi", "uvicorn", "pydantic", "diffusers", "gguf", "setuptools"} <= wheels
    assert not wheels & HOST_PACKAGES and "numpy==2.5.2" in manifest["host_has"]
    with tarfile.open(bundle / manifest["llama.cpp"]["archive"]) as tar:
        names = tar.getnames()
    assert {"llama.cpp/CMakeLists.txt", "llama.cpp/ggml/src/ggml-cuda/CMakeLists.txt"} <= set(names)
    assert "llama.cpp/tools/server/server.cpp" in names
    for dropped in ("llama.cpp/docs/", "llama.cpp/models/", "llama.cpp/ggml/src/ggml-vulkan/"):
        assert not any(name.startswith(dropped) for name in names), dropped
    assert (bundle / "nginx" / "bin" / "nginx").stat().st_mode & 0o111

    installed = subprocess.run(
        [SCRIPT, "--offline", str(bundle), "--dry-run"], capture_output=True, text=True, timeout=900
    )
    assert installed.returncode == 0, installed.stdout[-2000:] + installed.stderr[-3000:]
    assert "venv: imported modelrunner.cli, modelrunner.server.app, bench.gpu_check" in installed.stdout
    assert "diffusers-env: imported diffusers" in installed.stdout
