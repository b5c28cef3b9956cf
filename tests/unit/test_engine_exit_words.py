"""An engine that dies says how, in words (issue 35): a stand-in engine kills itself with each signal while it
loads, and the runner's error (what the API and the CLI show) names the signal, what it usually means, what
to do, and the engine's meaningful last lines rather than its banner."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

import pytest

from modelrunner.engines import exit_reason
from modelrunner.engines.base import LaunchSpec, Mode, ModelForEngine
from modelrunner.scheduler.runner import LoadError, Runner, RunnerKey

# What llama-server prints before its first matrix product, then a warning, then more banner.
ENGINE = """
import os, signal, sys
print("0.00.001 I srv  llama_server: initializing", flush=True)
print("0.00.002 W srv  load_model: the slot context exceeds the training context", flush=True)
print("0.00.003 I cmn  init: llama threadpool init, n_threads = 2", flush=True)
os.kill(os.getpid(), getattr(signal, sys.argv[1]))
"""


def die_while_loading(tmp_path: Path, engine: str, signum: str, memory: int = 3 << 30) -> str:
    script = tmp_path / "engine.py"
    script.write_text(ENGINE)
    model = ModelForEngine("sha256:" + "0" * 64, "ai/x", tmp_path, "gguf", None, 1)
    spec = LaunchSpec(argv=[sys.executable, str(script), signum], socket=tmp_path / "s.sock")
    log = tmp_path / "logs" / f"engine-{engine}-000000000000-completion.log"
    runner = Runner(
        RunnerKey(engine, model.id, Mode.COMPLETION), model, spec, memory, log, tmp_path / "pids", 60
    )
    with pytest.raises(LoadError) as info:
        asyncio.run(runner.start())
    return info.value.message


@pytest.mark.parametrize("engine", ["llama.cpp", "vllm", "diffusers"])
def test_sigill_says_the_build_does_not_fit_this_cpu(tmp_path: Path, engine: str) -> None:
    message = die_while_loading(tmp_path, engine, "SIGILL")
    assert message.startswith(
        "unable to load runner: the engine died by SIGILL: it was built for instructions this CPU cannot "
        f"run; run: model reinstall-runner --backend {engine}. Its last lines: "
    )
    assert message.endswith("0.00.002 W srv  load_model: the slot context exceeds the training context")


def test_sigkill_names_the_oom_killer_and_the_memory(tmp_path: Path) -> None:
    message = die_while_loading(tmp_path, "llama.cpp", "SIGKILL")
    assert "the engine was killed (SIGKILL), most often by the kernel's out-of-memory killer" in message
    assert "(the model needs about 3.0 GiB; " in message and " GiB free)" in message


@pytest.mark.parametrize("signum", ["SIGSEGV", "SIGABRT"])
def test_a_crash_points_at_the_engine_log(tmp_path: Path, signum: str) -> None:
    message = die_while_loading(tmp_path, "vllm", signum)
    assert (
        f"the engine crashed ({signum}): see its log engine-vllm-000000000000-completion.log (`model logs`)"
        in (message)
    )
    assert str(tmp_path) not in message  # never an absolute path


def test_other_endings() -> None:
    traceback = "x\nTraceback (most recent call last)\n  File a.py\nValueError: no GPU"
    assert exit_reason.describe_exit(3, engine="vllm", output=traceback) == (
        "engine exited with code 3: Traceback (most recent call last) | ValueError: no GPU"
    )
    # an abort's message has no level: the last line is kept beside the warnings (a lost RPC worker)
    aborted = (
        "0.00.6 W load: control-looking token: 212 '</s>' was not control-type\n"
        "ggml-rpc.cpp:569: Remote RPC server crashed or returned malformed response"
    )
    assert exit_reason.last_words(aborted).endswith("ggml-rpc.cpp:569: Remote RPC server crashed or returned "
                                                    "malformed response")  # fmt: skip
    assert exit_reason.describe_exit(-signal.SIGTERM, engine="vllm") == "the engine was ended by SIGTERM"
    assert exit_reason.describe_exit(-200, engine="vllm") == "the engine was ended by signal 200"
    banner_only = "\n".join(f"0.00.{i:03d} I srv  banner line {i}" for i in range(10))
    assert exit_reason.last_words(banner_only) == (
        "0.00.007 I srv  banner line 7 | 0.00.008 I srv  banner line 8 | 0.00.009 I srv  banner line 9"
    )
