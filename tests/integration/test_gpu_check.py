"""scripts/gpu-check --dry-run on this CPU machine: the GPU run's plan (issue #25 item 4) and everything it
can run without a GPU. The installers take `--gpu cuda`, the tests' three models are built (with the CPU
environments of the same engines) and packaged by a daemon that installs the CPU engines, every measurement
runs its own code on the CPU engines at a small scale (so that a change to bench/proxy.py or bench/relay.py
that the GPU run's code missed fails here, not on the GPU machine), and the plan fits the 12 minutes. The
run on a GPU is still owed (bench/RESULTS.md)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STEPS = {
    "machine",
    "build-llama.cpp-cuda",
    "install-vllm-cuda",
    "install-diffusers-cuda",
    "build-models",
    "daemon",
    "llama.cpp",
    "vllm",
    "diffusers",
    "relay",
    "vllm-ray",
}
INSTALLERS = {
    "build-llama.cpp-cuda": ["python", "-m", "modelrunner.engines.build", "--gpu", "cuda"],
    "install-vllm-cuda": ["python", "-m", "modelrunner.engines.vllm", "--gpu", "cuda"],
    "install-diffusers-cuda": ["python", "-m", "modelrunner.engines.diffusers", "--gpu", "cuda"],
}


def test_the_dry_run_writes_the_plan_and_checks_every_step(tmp_path: Path) -> None:
    out = tmp_path / "gpu-check.json"
    result = subprocess.run(
        [str(ROOT / "scripts" / "gpu-check"), "--dry-run", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    document = json.loads(out.read_text())
    assert result.returncode == 0, json.dumps(document["steps"], indent=1) + result.stderr[-3000:]
    assert document["mode"] == "dry-run"

    phases = [[list(lane) for lane in phase["lanes"]] for phase in document["plan"]]
    planned = [step for phase in phases for lane in phase for step in lane]
    names = [step["name"] for step in planned]
    assert len(names) == len(set(names)) and set(names) == STEPS  # every step named, once
    assert all(step["budget_s"] > 0 and step["what"] for step in planned)
    # a phase lasts as long as its longest lane; the whole run under 12 minutes
    total = sum(max(sum(step["budget_s"] for step in lane) for lane in phase) for phase in phases)
    assert total == document["plan_s"] and total < 720 == document["limit_s"]
    assert {s["name"]: s["command"] for s in planned if "command" in s} == INSTALLERS
    # the compile beside the pip installs, which run one after the other
    [install_phase] = [
        phase for phase in phases if any(s["name"] in INSTALLERS for lane in phase for s in lane)
    ]
    assert [[s["name"] for s in lane] for lane in install_phase] == [
        ["build-llama.cpp-cuda"],
        ["install-vllm-cuda", "install-diffusers-cuda"],
    ]

    steps = document["steps"]
    assert set(steps) == STEPS
    assert {name: entry["status"] for name, entry in steps.items()} == dict.fromkeys(STEPS, "dry-run")
    assert {name: entry["budget_s"] for name, entry in steps.items()} == {
        step["name"]: step["budget_s"] for step in planned
    }
    assert set(steps["build-models"]["result"]) == {"llama.cpp", "vllm", "diffusers"}
    packaged = [tag for tags in steps["daemon"]["result"]["models"] for tag in tags]
    assert sorted(packaged) == [f"docker.io/ai/bench-{m}:latest" for m in ("gguf", "sd", "vllm")]
    # each measurement ran: the three paths of bench/proxy.py at c=1, images both ways, the relay at the
    # rate each engine was measured at (the numbers are the CPU engines', not a GPU's)
    for engine in ("llama.cpp", "vllm"):
        row = steps[engine]["result"]["levels"]["1"]
        for path in ("direct", "daemon", "nginx"):
            assert row[path]["requests"] == 8 and row[path]["ttft_p50_ms"] > 0, (engine, path, row)
        assert document["added_ttft_p50_ms_c1"][engine] == row["added_ttft_p50_ms"]
    images = steps["diffusers"]["result"]["levels"]["1"]
    assert images["direct_images_per_s"] > 0 and images["daemon_images_per_s"] > 0
    relay = steps["relay"]["result"]
    assert set(relay) == {"llama.cpp", "vllm"}
    assert all(
        relay[engine]["step_ms"] > 0 and relay[engine]["levels"]["16"]["cpu_ratio"] > 0 for engine in relay
    )
    assert "--ray-address" in steps["vllm-ray"]["result"]["checked"]
    assert document["machine"]["cpus"] >= 1 and "nvidia_smi" in document["machine"]
