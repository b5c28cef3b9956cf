"""Ray nodes on this machine, started with the vLLM environment's own `ray` (the pinned Ray of
engines/ray_cluster.py): the cluster of tests/integration/test_ray_cluster.py and the one-node GPU cluster
of bench/gpu_check.py."""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modelrunner.engines import ray_cluster


@dataclass
class RayNode:
    process: subprocess.Popen[bytes]
    log: Path

    def stop(self) -> None:
        """`ray start --block` ends its node's processes when terminated."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_node(
    venv: Path, temp_dir: Path, log: Path, head_port: int, head: bool, num_cpus: int = 1, num_gpus: int = 0
) -> RayNode:
    argv = [str(venv / "bin" / "ray"), "start", "--block", "--num-cpus", str(num_cpus)]
    argv += ["--num-gpus", str(num_gpus), "--temp-dir", str(temp_dir), "--disable-usage-stats"]
    argv += ["--head", "--port", str(head_port), "--include-dashboard", "false"] if head else []
    argv += [] if head else ["--address", f"127.0.0.1:{head_port}"]
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    with open(log, "ab") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    return RayNode(process, log)


def wait_for_nodes(venv: Path, address: str, count: int, timeout: float = 300) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        try:
            status = ray_cluster.probe(venv / "bin" / "python", address)
            if len([n for n in status.get("nodes", []) if n.get("alive")]) == count:
                return status
        except Exception:
            if time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            raise TimeoutError(f"the Ray cluster did not reach {count} nodes")
        time.sleep(2)
