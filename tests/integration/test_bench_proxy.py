"""bench/proxy.py runs end to end (in a small configuration): the three paths (direct, the daemon, nginx) at
each concurrency, and the cold start, whose engine started by hand gets its own slot folder (the runner's,
for warm resume, is removed with it). The bench once waited forever there; numbers are the bench's
business, not this test's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_proxy_bench_measures_the_three_paths_and_the_cold_start(
    tmp_path: Path, llama_server: Path
) -> None:
    out = tmp_path / "proxy.json"
    command = [sys.executable, str(ROOT / "bench" / "proxy.py"), "--rounds", "1", "--max-tokens", "4"]
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    result = subprocess.run(
        [*command, "--output", str(out)], capture_output=True, text=True, timeout=600, env=env
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    document = json.loads(out.read_text())
    for level in document["levels"].values():
        assert all(level[path]["ttft_p50_ms"] > 0 for path in ("direct", "daemon", "nginx"))
    cold = document["cold_start"]
    assert cold["direct_s"] > 0 and cold["daemon_s"] > 0 and cold["rss_total_bytes"] > 0
