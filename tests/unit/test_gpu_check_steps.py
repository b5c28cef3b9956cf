"""bench/gpu_check.py's step runner: a step that fails or runs out of its budget records why, and the
run goes on; a command that runs out is ended with all its processes."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from bench.gpu_check import (
    BUILD_LLAMA_OFFLINE,
    DIFFUSERS_ENV_OFFLINE,
    OFFLINE_LIMIT_S,
    OFFLINE_PLAN,
    VLLM_NOT_BROUGHT,
    Run,
    Step,
    StepTimeout,
    action,
    plan_seconds,
    run_command,
    start_daemon_offline,
)


def test_a_failed_or_spent_step_records_its_error_and_the_next_runs(tmp_path: Path) -> None:
    run = Run(dry=False, work=tmp_path)

    def fails() -> dict[str, object]:
        raise RuntimeError("no GPU")

    def sleeps() -> dict[str, object]:
        time.sleep(60)
        return {}

    run.record(Step("fails", 5, "a step that fails"), fails)
    run.record(Step("spent", 1, "a step longer than its budget"), sleeps)
    run.record(Step("next", 5, "the run goes on"), lambda: {"n": 1})
    assert run.steps["fails"]["status"] == "error" and "no GPU" in run.steps["fails"]["error"]
    assert run.steps["spent"]["status"] == "timeout" and "1 s budget" in run.steps["spent"]["error"]
    assert run.steps["next"]["status"] == "ok" and run.steps["next"]["result"] == {"n": 1}


def test_a_command_out_of_budget_is_ended_with_its_children(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    script = f"sleep 300 & echo $! > {pids}; wait"
    with pytest.raises(StepTimeout, match="1 s budget"):
        run_command(["sh", "-c", script], 1)
    # the background sleep was in the command's process group: ended too (gone, or a zombie not yet reaped)
    # (its pid may already be another process's: only a live `sleep` there would be the one left behind)
    proc = Path(f"/proc/{int(pids.read_text())}")
    try:
        left = proc.joinpath("cmdline").read_bytes() == b"sleep\x00300\x00"
        left = left and proc.joinpath("stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        left = False
    assert not left


def test_the_offline_run_records_vllm_as_not_available_and_fits_one_command(tmp_path: Path) -> None:
    """--offline (issue #35): vLLM cannot be brought to a host with no network; its step says so (not an
    error), and the plan leaves the install its minute of the 10 a command may run."""
    run = Run(dry=False, work=tmp_path, bundle=tmp_path / "bundle")
    run.record(VLLM_NOT_BROUGHT, action(run, VLLM_NOT_BROUGHT))
    entry = run.steps["vllm"]
    assert entry["status"] == "not-available" and "64 MiB" in entry["reason"]
    names = [step.name for phase in OFFLINE_PLAN for lane in phase for step in lane]
    assert len(names) == len(set(names)) and "vllm-ray" not in names
    assert run.plan == OFFLINE_PLAN and plan_seconds(run.plan) <= OFFLINE_LIMIT_S <= 600 - 60


def test_the_offline_daemon_step_leaves_out_an_engine_whose_step_failed(tmp_path: Path) -> None:
    """A compile out of its budget leaves diffusers to be measured; with neither engine there is nothing
    to start a daemon for, and the step says why."""
    run = Run(dry=False, work=tmp_path, bundle=tmp_path / "bundle")
    run.steps[BUILD_LLAMA_OFFLINE.name] = {"status": "timeout"}
    run.steps[DIFFUSERS_ENV_OFFLINE.name] = {"status": "error"}
    with pytest.raises(RuntimeError, match="no engine to measure") as raised:
        start_daemon_offline(run)
    assert "build-llama.cpp-cuda ended timeout" in str(raised.value) and run.daemon is None
