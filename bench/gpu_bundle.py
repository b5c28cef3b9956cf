"""What the GPU run (bench/gpu_check.py) needs on a GPU host with no network (issue #35), made here, and its
offline install there.

    scripts/gpu-check --bundle DIR            # here: DIR/wheels, DIR/llama.cpp-<version>.tar.gz, DIR/nginx
    scripts/gpu-check --offline DIR           # there: install offline into .venv, then the run (gpu_check.py)
    scripts/gpu-check --offline DIR --dry-run # here: the offline install into a fresh venv, nothing fetched

The host (bench/RESULTS.md; the device notes' KINDS.md): Python 3.12 with torch and much else, but not the
daemon's web stack nor diffusers; at most 64 MiB brought, the checkout included. So the bundle holds:

* wheels for CPython 3.12 manylinux x86_64 of the daemon's dependencies (pyproject.toml), of the diffusers
  engine's (diffusers, fastapi, uvicorn at their pins in engines/diffusers.py) and setuptools (to build
  modelrunner from the checkout, which travels anyway: no modelrunner wheel is brought), less every
  package the host already has (HOST_PACKAGES);
* llama.cpp's pinned source (engines/build.py: the same sdist, hash-checked) without what a CUDA build of
  llama-server never reads (TRIMMED): docs, tests, examples, the sample models, the other backends, the web
  UI's sources (built with -DLLAMA_USE_PREBUILT_UI=OFF). The trimmed tree is configured and its UI step run
  with the CPU recipe here, which proves nothing it needs was removed (CUDA cannot be configured here);
* nginx and the libraries it links (bench/relay.py's reference), in case the host has none.

`install` runs under the host's python3 before anything else is there: the standard library only. The venv
is made with --system-site-packages, and when that python3 is itself a venv (the host's is) a .pth file adds
its site-packages, which --system-site-packages alone would not show.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIMIT_BYTES = 55 * 1024 * 1024  # of the 64 MiB that travel, the checkout (~4 MiB) and a margin left
PYTHON_VERSION = "3.12"
PLATFORMS = (
    "manylinux2014_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux_2_28_x86_64",
    "manylinux_2_34_x86_64",
)
# The GPU host's packages (KINDS.md's list, read 2026-11-17): their wheels are not brought. Only versions
# the host's `pip list` showed are pinned in the dry run's stand-in host; the rest get the newest.
_HOST_LIST = """
accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs certifi
charset-normalizer click cmake filelock fsspec h11 hf-xet httpcore httpx huggingface-hub idna jinja2
markdown-it-py markupsafe mdurl ninja numpy packaging pillow pip prometheus-client protobuf psutil
pygments pytest pyyaml regex requests rich safetensors six sympy tokenizers torch tqdm transformers
triton typing-extensions urllib3 uvloop wheel zipp
"""
HOST_PACKAGES = frozenset(_HOST_LIST.split())
HOST_VERSIONS = {"huggingface-hub": "1.33.0", "numpy": "2.5.2", "safetensors": "0.8.0"}
WHEELS = "wheels"
NGINX = "nginx"
MANIFEST = "bundle.json"
INSTALL_RECORD = "offline-install.json"
# Paths of the llama.cpp folder a CUDA build of llama-server and ggml-rpc-server never reads.
TRIMMED = (
    "docs", "examples", "tests", "benches", "media", "models", "gguf-py", "conversion", "pocs", "skills",
    "requirements", "ci", ".devops", ".github", "tools/server/tests", "tools/server/webui",
    "tools/ui/src", "tools/ui/tests", "tools/ui/package-lock.json",
    *(f"ggml/src/ggml-{name}" for name in (
        "blas", "cann", "et", "hexagon", "hip", "metal", "musa", "opencl", "openvino", "sycl", "virtgpu",
        "vulkan", "webgpu", "zdnn", "zendnn",
    )),
)  # fmt: skip
TRIMMED_SUFFIXES = (".py", ".md", ".nix")  # the converters, READMEs: no build reads them
KEPT_NAMES = ("CMakeLists.txt", "LICENSE")


def normal(name: str) -> str:
    """A distribution's name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_name(path: Path) -> tuple[str, str]:
    name, version = path.name.split("-")[:2]
    return normal(name), version


# ---- here: the bundle ------------------------------------------------------------------------------------


def requirements() -> list[str]:
    """The daemon's dependencies (gguf among them), the diffusers engine's pins of what the host lacks, and
    setuptools (modelrunner's build backend, for the install from the checkout)."""
    import tomllib

    from modelrunner.engines import diffusers

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    engine = [r for r in diffusers.REQUIREMENTS if normal(re.split(r"[=<>]", r)[0]) not in HOST_PACKAGES]
    return [*project["project"]["dependencies"], *engine, *project["build-system"]["requires"]]


def download_wheels(dest: Path) -> dict[str, list[str]]:
    """pip's wheels for the host's Python and platform, then the host's own packages taken out."""
    argv = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--quiet"]
    argv += ["--only-binary=:all:", "--python-version", PYTHON_VERSION, "--implementation", "cp"]
    argv += [flag for platform in PLATFORMS for flag in ("--platform", platform)]
    subprocess.run([*argv, "-d", str(dest), *requirements()], check=True)
    kept, left_out = [], []
    for wheel in sorted(dest.glob("*.whl")):
        name, version = wheel_name(wheel)
        if name in HOST_PACKAGES:
            left_out.append(f"{name}=={HOST_VERSIONS.get(name, version)}")
            wheel.unlink()
        else:
            kept.append(wheel.name)
    return {"wheels": kept, "host_has": left_out}


def trim(source: Path) -> int:
    """Remove from an extracted llama.cpp folder what the build never reads; return the files removed."""
    removed = 0
    for relative in TRIMMED:
        path = source / relative
        if path.is_dir():
            removed += sum(1 for p in path.rglob("*") if p.is_file())
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
            removed += 1
    for path in source.rglob("*"):
        helper = path.suffix == ".py" and path.parent != source  # a build's own helper scripts stay
        if path.is_file() and path.suffix in TRIMMED_SUFFIXES and path.name not in KEPT_NAMES and not helper:
            path.unlink()
            removed += 1
    return removed


def check_configures(source: Path, work: Path) -> float:
    """The trimmed tree configures with the CPU recipe, and its UI step (which reads tools/ui) runs."""
    from modelrunner.engines.build import BuildSpec

    started = time.monotonic()
    build = work / "configure-check"
    flags = list(BuildSpec("none").cmake_flags)
    run_tool(["cmake", "-S", str(source), "-B", str(build), *flags], "configuring the trimmed llama.cpp")
    run_tool(
        ["cmake", "--build", str(build), "--target", "llama-ui-assets"], "the UI step of the trimmed tree"
    )
    shutil.rmtree(build)
    return time.monotonic() - started


def run_tool(argv: list[str], what: str) -> None:
    result = subprocess.run(argv, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"{what} failed:\n{(result.stdout + result.stderr)[-3000:]}")


def llama_source(dest: Path, work: Path) -> dict[str, object]:
    """engines/build.py's pinned, hash-checked source, trimmed and proven to configure, as a tar.gz."""
    from modelrunner.engines.build import VERSION, _fetch_source

    source = _fetch_source(work, lambda line: print(line, flush=True))
    removed = trim(source)
    seconds = check_configures(source, work)
    archive = dest / f"llama.cpp-{VERSION}.tar.gz"
    with tarfile.open(archive, "w:gz", compresslevel=9) as tar:
        tar.add(source, arcname="llama.cpp")
    return {
        "archive": archive.name,
        "version": VERSION,
        "files_removed": removed,
        "configure_check_s": round(seconds, 1),
    }


def bundle_nginx(dest: Path) -> dict[str, object]:
    """This machine's nginx with the libraries it links (not libc's), behind a wrapper that finds them."""
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    (dest / "lib").mkdir(parents=True)
    (dest / "bin").mkdir()
    shutil.copy2(nginx, dest / "lib" / "nginx")
    ldd = subprocess.run(["ldd", nginx], capture_output=True, text=True, check=True).stdout
    libraries = re.findall(r"=> (/\S+)", ldd)
    for library in libraries:
        if not Path(library).name.startswith(("libc.so", "libm.so", "ld-linux")):
            shutil.copy2(library, dest / "lib" / Path(library).name)
    wrapper = dest / "bin" / "nginx"
    wrapper.write_text(
        '#!/bin/sh\nlib="$(dirname "$0")/../lib"\nLD_LIBRARY_PATH="$lib" exec "$lib/nginx" "$@"\n'
    )
    wrapper.chmod(0o755)
    return {"nginx": nginx, "libraries": sorted(p.name for p in (dest / "lib").iterdir())}


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def make_bundle(dest: Path) -> int:
    if dest.exists() and any(dest.iterdir()):
        raise SystemExit(f"{dest} is not empty: give a new folder")
    dest.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    manifest: dict[str, object] = {"python": PYTHON_VERSION, "platforms": list(PLATFORMS)}
    manifest |= download_wheels(dest / WHEELS)
    with tempfile.TemporaryDirectory(prefix="gpu-bundle-") as work:
        manifest["llama.cpp"] = llama_source(dest, Path(work))
    manifest["nginx"] = bundle_nginx(dest / NGINX)
    size = folder_bytes(dest)
    manifest |= {"bytes": size, "seconds": round(time.monotonic() - started, 1)}
    (dest / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    limit = f"{LIMIT_BYTES / 2**20:.0f} MiB"
    print(f"bundle {dest}: {size / 2**20:.1f} MiB (limit {limit}) in {manifest['seconds']} s")
    if size > LIMIT_BYTES:
        print(f"Error: the bundle is over {LIMIT_BYTES / 2**20:.0f} MiB", file=sys.stderr)
        return 1
    return 0


# ---- there: the offline install (the standard library only) ---------------------------------------------


def host_site_packages(python: str) -> list[str]:
    """The site-packages a venv made from `python` would not see: those of `python`'s own venv, if any."""
    probe = "import json, site, sys; "
    probe += "print(json.dumps(site.getsitepackages() if sys.prefix != sys.base_prefix else []))"
    return list(
        json.loads(subprocess.run([python, "-c", probe], capture_output=True, text=True, check=True).stdout)
    )


def make_venv(python: str, venv: Path) -> Path:
    """A venv over the host's packages (torch, ...): --system-site-packages, plus a .pth for a venv's."""
    subprocess.run([python, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True)
    target = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(target), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    extra = host_site_packages(python)
    if extra:
        Path(purelib, "_host_site_packages.pth").write_text("\n".join(extra) + "\n")
    return target


def pip_offline(python: str, target: Path, bundle: Path, *requirements: str) -> None:
    """The host's pip installs into `target`'s environment from the bundle alone (no index, no pip config:
    this machine's wheel store must not help the dry run)."""
    argv = [python, "-m", "pip", "--python", str(target), "install", "--disable-pip-version-check"]
    argv += ["--no-index", "--find-links", str(bundle / WHEELS), "--quiet", *requirements]
    subprocess.run(argv, check=True, env={**os.environ, "PIP_CONFIG_FILE": os.devnull})


def install(bundle: Path, venv: Path, python: str = "python3") -> dict[str, object]:
    """The checkout's modelrunner, its dependencies from the bundle, into a new venv."""
    started = time.monotonic()
    if venv.exists():
        raise SystemExit(f"{venv} exists: the offline install makes a new one")
    target = make_venv(python, venv)
    pip_offline(python, target, bundle, str(ROOT))
    record = {"venv": str(venv), "host_python": python, "seconds": round(time.monotonic() - started, 1)}
    (venv / INSTALL_RECORD).write_text(json.dumps(record) + "\n")  # for gpu_check's JSON
    return record


def install_diffusers_env(bundle: Path, env: Path, python: str) -> None:
    """The diffusers engine's environment: the host's torch and transformers, diffusers and its server's
    web stack from the bundle."""
    target = make_venv(python, env)
    pip_offline(python, target, bundle, "diffusers", "fastapi", "uvicorn")


# What the dry run imports from each environment it installed: in the daemon's, the run itself too
# (bench/gpu_check.py imports the tests' helpers, and they pytest: the host has it, the stand-in gets it).
PROBES = {
    "venv": ("modelrunner.cli", "modelrunner.server.app", "bench.gpu_check", "bench.gpu_models"),
    "diffusers-env": ("diffusers", "fastapi", "uvicorn", "PIL"),
}
RUN_NEEDS_FROM_HOST = ("pytest",)


def host_like_python() -> str:
    """A Python of the host's version here: on PATH, or one of pyenv's (whose shim may refuse)."""
    found = [shutil.which(f"python{PYTHON_VERSION}")]
    found += sorted(str(p) for p in Path.home().glob(f".pyenv/versions/{PYTHON_VERSION}.*/bin/python3"))
    for python in filter(None, found):
        if subprocess.run([python, "--version"], capture_output=True).returncode == 0:
            return python
    raise SystemExit(f"the dry run needs python{PYTHON_VERSION} (the host's Python)")


def dry_install(bundle: Path) -> int:
    """The offline install, here: a stand-in host (a Python 3.12 venv holding the packages the bundle leaves
    to the host), the bundle installed into a fresh venv over it with no index, and modelrunner imported."""
    manifest = json.loads((bundle / MANIFEST).read_text())
    python = host_like_python()
    with tempfile.TemporaryDirectory(prefix="gpu-offline-") as work:
        host = Path(work) / "host"
        subprocess.run([python, "-m", "venv", str(host)], check=True)
        host_python = str(host / "bin" / "python")
        pip = [host_python, "-m", "pip", "install", "--disable-pip-version-check", "--quiet"]
        # the host's part, fetched here: it is not in the bundle
        subprocess.run([*pip, *manifest["host_has"], *RUN_NEEDS_FROM_HOST], check=True)
        started = time.monotonic()
        result = install(bundle, Path(work) / "venv", host_python)
        install_diffusers_env(bundle, Path(work) / "diffusers-env", host_python)
        seconds = time.monotonic() - started
        for env, modules in PROBES.items():
            probe = f"import {', '.join(modules)}; print('{env}: imported {', '.join(modules)}')"
            subprocess.run([str(Path(work) / env / "bin" / "python"), "-c", probe], check=True, cwd=ROOT)
    print(f"offline install of {bundle} ({folder_bytes(bundle) / 2**20:.1f} MiB): the daemon's venv "
          f"{result['seconds']} s, with the diffusers environment {seconds:.1f} s")  # fmt: skip
    return 0


def build_llama(bundle: Path, work: Path) -> int:
    """On the GPU host: engines/build.py's own build of the CUDA recipe (GGML_NATIVE, so for this machine's
    GPU only), smoke test and fallbacks included, from the bundle's trimmed copy of the same pinned source
    instead of pip's download."""
    from modelrunner.engines import build

    with tarfile.open(bundle / f"llama.cpp-{build.VERSION}.tar.gz") as tar:
        tar.extractall(work / "src", filter="data")
    source = work / "src" / "llama.cpp"

    def bundled_source(work: Path, progress: Callable[[str], None]) -> Path:
        progress(f"Using the bundle's llama.cpp {build.VERSION} source (no network here)")
        return source

    build._fetch_source = bundled_source
    use_cuda_compiler()
    started = time.monotonic()
    spec = build.BuildSpec("cuda")
    binary = build.ensure_built(spec, lambda line: print(line, flush=True))
    info = build.build_info(spec)
    found = {
        "seconds": round(time.monotonic() - started, 1),
        "binary": str(binary),
        "cuda_code": cuda_code(binary),
        "nvcc": shutil.which("nvcc"),
    } | {key: info.get(key) for key in ("build_seconds", "turned_off", "smoke_test", "cmake_flags")}
    print(json.dumps(found), flush=True)
    return 0


def use_cuda_compiler() -> None:
    """nvcc on PATH for CMake, where the toolkit is installed but not on PATH."""
    if shutil.which("nvcc") is None:
        for nvcc in sorted(Path("/usr/local").glob("cuda*/bin/nvcc")):
            os.environ["PATH"] = f"{nvcc.parent}{os.pathsep}{os.environ['PATH']}"
            return


def cuda_code(binary: Path) -> list[str]:
    """The GPU architectures compiled into the binary (cuobjdump's list of its CUDA ELF images)."""
    if shutil.which("cuobjdump") is None:
        return ["cuobjdump not found"]
    listed = subprocess.run(["cuobjdump", "--list-elf", str(binary)], capture_output=True, text=True)
    return sorted(set(re.findall(r"sm_\w+", listed.stdout))) or [listed.stderr.strip()[-300:]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/gpu_bundle.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("action", choices=("bundle", "install", "dry-install", "build-llama"))
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--venv", type=Path, default=ROOT / ".venv", help="install: the venv to make")
    parser.add_argument("--work", type=Path, help="build-llama: the folder to build in")
    args = parser.parse_args(argv)
    if args.action == "bundle":
        sys.path.insert(0, str(ROOT / "src"))
        return make_bundle(args.bundle.resolve())
    if args.action == "install":
        if (args.venv / "bin" / "python").exists():
            print(f"{args.venv} exists: the offline install was done")
            return 0
        print(json.dumps(install(args.bundle.resolve(), args.venv)), flush=True)
        return 0
    if args.action == "build-llama":
        if args.work is None:
            parser.error("build-llama needs --work")
        return build_llama(args.bundle.resolve(), args.work)
    return dry_install(args.bundle.resolve())


if __name__ == "__main__":
    sys.exit(main())
