"""Which accelerator this machine has, and whether the toolchain to build an engine for it is installed.

Detection is cheap (a device node, one `nvidia-smi` call) so `model status` can show it every time.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from modelrunner.errors import BadRequest, EngineUnsupported

GPU_KINDS = ("auto", "none", "cuda", "vulkan")
# DMR's other `--gpu` kinds (it has container images for them): what their llama.cpp needs, not built here
UNBUILT_GPU_KINDS = {"rocm": "AMD ROCm (HIP)", "musa": "Moore Threads MUSA", "cann": "Huawei Ascend CANN"}


@dataclass(frozen=True)
class Accelerator:
    kind: str  # "cuda" | "vulkan" | "none"
    name: str  # what a person reads, e.g. "NVIDIA H200 (140 GiB)" or "CPU: AMD EPYC, 2 cores"
    memory_bytes: int | None = None

    def to_json(self) -> dict[str, object]:
        return {"kind": self.kind, "name": self.name, "memory_bytes": self.memory_bytes}


def cpu_count() -> int:
    """CPUs this process may run on (a container's limit, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _nvidia_gpus() -> list[tuple[str, int | None]]:
    if not Path("/dev/nvidia0").exists() and shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    gpus: list[tuple[str, int | None]] = []
    for line in out.splitlines():
        name, _, mib = line.partition(",")
        if name.strip():
            memory = int(mib.strip()) * 1024 * 1024 if mib.strip().isdigit() else None
            gpus.append((name.strip(), memory))
    return gpus


def _render_nodes() -> list[Path]:
    return sorted(Path("/dev/dri").glob("renderD*")) if Path("/dev/dri").is_dir() else []


def detect_accelerator() -> Accelerator:
    gpus = _nvidia_gpus()
    if gpus:
        name, memory = gpus[0]
        label = f"{name} ({memory / 2**30:.0f} GiB)" if memory else name
        if len(gpus) > 1:
            label += f" and {len(gpus) - 1} more"
        return Accelerator("cuda", label, memory)
    if _render_nodes():
        return Accelerator("vulkan", "a GPU render device")
    return Accelerator("none", f"no GPU; CPU: {cpu_name()}, {cpu_count()} cores")


def cuda_device_count() -> int:
    """NVIDIA GPUs of this machine (0 without any): how many vLLM workers it can hold itself."""
    return len(_nvidia_gpus())


def find_nvcc() -> str | None:
    """nvcc from CUDACXX, PATH, or CUDA_HOME / CUDA_PATH: where CMake will look for it too."""
    explicit = os.environ.get("CUDACXX")
    if explicit and os.access(explicit, os.X_OK):
        return explicit
    found = shutil.which("nvcc")
    if found:
        return found
    for var in ("CUDA_HOME", "CUDA_PATH"):
        root = os.environ.get(var)
        if root and os.access(Path(root) / "bin" / "nvcc", os.X_OK):
            return str(Path(root) / "bin" / "nvcc")
    return None


def _has_vulkan_sdk() -> bool:
    headers = any(Path(d, "vulkan", "vulkan.h").is_file() for d in ("/usr/include", "/usr/local/include"))
    return shutil.which("glslc") is not None and headers


def check_gpu_kind(requested: str) -> None:
    """A `--gpu` this runner builds for; DMR's ROCm, MUSA and CANN kinds are refused, naming the lack."""
    if requested in UNBUILT_GPU_KINDS:
        raise EngineUnsupported(
            f"--gpu {requested} needs a llama.cpp built for {UNBUILT_GPU_KINDS[requested]}, which this model "
            "runner does not build (it builds for CUDA, Vulkan or the CPU): use --gpu cuda, vulkan, none or "
            "auto"
        )
    if requested not in GPU_KINDS:
        raise BadRequest(f"unknown --gpu value {requested!r}: use one of {', '.join(GPU_KINDS)}")


def resolve_gpu(requested: str) -> str:
    """The build flavour for `--gpu`: "none", "cuda" or "vulkan"; a clear error when it cannot be built."""
    check_gpu_kind(requested)
    if requested == "auto":
        kind = detect_accelerator().kind
        if kind == "cuda" and find_nvcc():
            return "cuda"
        if kind == "vulkan" and _has_vulkan_sdk():
            return "vulkan"
        return "none"
    if requested == "cuda" and find_nvcc() is None:
        raise EngineUnsupported(
            "--gpu cuda needs the CUDA toolkit, and nvcc was not found (looked at CUDACXX, PATH, CUDA_HOME): "
            "install the CUDA toolkit and put nvcc on PATH, or use --gpu none"
        )
    if requested == "vulkan" and not _has_vulkan_sdk():
        raise EngineUnsupported(
            "--gpu vulkan needs the Vulkan SDK (glslc and the Vulkan headers), which were not found: "
            "install them (Debian: apt-get install glslc libvulkan-dev), or use --gpu none"
        )
    return requested
