"""vLLM beyond one process, without a cluster: parallel sizes and the Ray address from the settings to the
command line, the environment and the memory share; the Ray address's checks; `_configure`'s new keys;
VLLM_SERVER_PATH. (tests/integration/test_ray_cluster.py runs a real two-node Ray cluster.)"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from modelrunner.engines import ray_cluster, vllm
from modelrunner.engines.base import InstallState, Mode, ModelForEngine, RunnerSettings
from modelrunner.engines.llamacpp_settings import LlamaCppSettings
from modelrunner.engines.vllm_settings import VllmSettings
from modelrunner.errors import BadRequest, EngineUnavailable
from modelrunner.scheduler.settings import ModelSettings, SettingsStore
from modelrunner.server.admin_api import ConfigureRequest, settings_from_request
from tests.engine_settings import runner_settings

SOCKET = Path("/run/x/inference-runner-0.sock")
ID = "sha256:" + "c" * 64
HF_CONFIG = {"num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 64,
             "hidden_size": 128, "max_position_embeddings": 512, "torch_dtype": "float32"}  # fmt: skip


@pytest.fixture(autouse=True)
def no_cluster_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (ray_cluster.ADDRESS_ENV, "VLLM_SERVER_PATH", vllm.THREADS_BIND_ENV, vllm.KV_SPACE_ENV):
        monkeypatch.delenv(name, raising=False)


def bundle(tmp_path: Path) -> ModelForEngine:
    folder = tmp_path / "bundle" / "model"
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"x" * 4000)
    (folder / "config.json").write_text(json.dumps(HF_CONFIG))
    return ModelForEngine(ID, "ai/tiny", tmp_path / "bundle", "safetensors", None, 4000)


def fake_venv(root: Path, version: str = "0.32.0+cpu") -> Path:
    """What an installed vLLM environment looks like from outside: bin/vllm and its dist-info."""
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "vllm").write_text("#!/bin/sh\n")
    (root / "bin" / "vllm").chmod(0o755)
    (root / "lib" / "python3.11" / "site-packages" / f"vllm-{version}.dist-info").mkdir(parents=True)
    return root


@pytest.fixture
def engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> vllm.VllmEngine:
    monkeypatch.setenv("VLLM_SERVER_PATH", str(fake_venv(tmp_path / "venv") / "bin"))
    return vllm.VllmEngine(install_root=tmp_path / "engines")


def test_vllm_server_path_is_an_installed_engine(engine: vllm.VllmEngine, tmp_path: Path) -> None:
    status = engine.status()
    assert status.state is InstallState.RUNNING and status.version == "0.32.0+cpu"
    assert engine.venv() == (tmp_path / "venv", "cpu")


def test_parallel_sizes_reach_the_command_line_after_the_runtime_flags(
    engine: vllm.VllmEngine, tmp_path: Path
) -> None:
    model = bundle(tmp_path)
    settings = runner_settings(
        VllmSettings, runtime_flags=("-tp", "4"), tensor_parallel_size=2, pipeline_parallel_size=3
    )
    spec = engine.launch_spec(model, Mode.COMPLETION, settings, SOCKET)
    tail = spec.argv[spec.argv.index("-tp") :]
    assert tail[:2] == ["-tp", "4"]  # the user's flag, overridden by the setting that follows it
    assert tail[tail.index("--tensor-parallel-size") + 1] == "2"
    assert tail[tail.index("--pipeline-parallel-size") + 1] == "3"
    assert "--distributed-executor-backend" not in spec.argv  # no cluster: vLLM's own processes
    assert spec.preflight is None and "RAY_ADDRESS" not in spec.env
    assert spec.layout == {"tensor_parallel_size": 2, "pipeline_parallel_size": 3, "executor": "mp",
                           "local_workers": 6}  # fmt: skip
    # every local CPU worker gets its share of the CPUs (vLLM would bind one per NUMA node)
    assert spec.env[vllm.THREADS_BIND_ENV].count("|") == 5


def test_a_ray_address_runs_the_workers_on_the_cluster(
    engine: vllm.VllmEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = bundle(tmp_path)
    monkeypatch.setenv(ray_cluster.ADDRESS_ENV, "10.0.0.1:6379")
    spec = engine.launch_spec(
        model, Mode.COMPLETION, runner_settings(VllmSettings, pipeline_parallel_size=2), SOCKET
    )
    assert spec.argv[spec.argv.index("--distributed-executor-backend") + 1] == "ray"
    assert spec.env["RAY_ADDRESS"] == "10.0.0.1:6379" and spec.env["RAY_USAGE_STATS_ENABLED"] == "0"
    assert vllm.THREADS_BIND_ENV not in spec.env  # one worker here
    assert spec.layout["executor"] == "ray" and spec.layout["local_workers"] == 1
    assert spec.preflight is not None
    # the model's own address wins over the environment's
    own = engine.launch_spec(
        model, Mode.COMPLETION, runner_settings(VllmSettings, ray_address="10.0.0.9:7000"), SOCKET
    )
    assert own.env["RAY_ADDRESS"] == "10.0.0.9:7000"
    assert "--pipeline-parallel-size" not in own.argv  # sizes of 1 are vLLM's defaults


def test_the_memory_estimate_counts_only_this_machines_workers(
    engine: vllm.VllmEngine, tmp_path: Path
) -> None:
    model = bundle(tmp_path)
    one = engine.estimate_memory(model, RunnerSettings())
    assert one == 4000 + vllm.GIB + vllm.CPU_OVERHEAD_BYTES
    local_two = engine.estimate_memory(model, runner_settings(VllmSettings, tensor_parallel_size=2))
    assert local_two == 4000 + 2 * vllm.GIB + vllm.CPU_OVERHEAD_BYTES + vllm.CPU_WORKER_OVERHEAD_BYTES
    on_ray = engine.estimate_memory(
        model, runner_settings(VllmSettings, pipeline_parallel_size=2, ray_address="10.0.0.1:1")
    )
    assert on_ray == 2000 + vllm.GIB + vllm.CPU_OVERHEAD_BYTES  # half the weights, one worker's KV


def test_cpu_binding_shares() -> None:
    assert vllm.omp_binding([0, 1], 2) == "0|1"
    assert vllm.omp_binding(list(range(16)), 2) == "0-7|8-15"
    assert vllm.omp_binding([0, 1, 2], 2) == "0|1-2"
    assert vllm.omp_binding([0, 2, 4, 6], 2) == "0,2|4,6"
    assert vllm.omp_binding([3], 2) == "3|3"  # fewer CPUs than workers: they share


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("10.0.0.1:6379", "10.0.0.1:6379"),
        ("head.ray.svc", "head.ray.svc:6379"),
        ("[fd00::1]:7000", "[fd00::1]:7000"),
    ],
)
def test_ray_addresses(text: str, expected: str) -> None:
    assert ray_cluster.parse_address(text) == expected


@pytest.mark.parametrize(
    ("text", "why"),
    [("ray://head:10001", "Ray Client"), ("head:0", "port"), ("head:x", "port"), ("a b:1", "host name")],
)
def test_bad_ray_addresses(text: str, why: str) -> None:
    with pytest.raises(BadRequest, match=why):
        ray_cluster.parse_address(text)


def test_layouts_that_cannot_run_here_without_a_cluster() -> None:
    with pytest.raises(BadRequest, match="needs 4 GPUs and this machine has 2"):
        ray_cluster.layout_for(2, 2, None, local_devices=2)
    assert ray_cluster.layout_for(2, 1, None, local_devices=2).ray_address is None
    assert ray_cluster.layout_for(8, 1, None, local_devices=0).world_size == 8  # CPU: local processes
    with pytest.raises(BadRequest, match="at least 1"):
        ray_cluster.layout_for(0, 1, None, 0)


def test_an_unreachable_cluster_is_a_quick_503(tmp_path: Path) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    with pytest.raises(EngineUnavailable) as info:
        ray_cluster.probe(tmp_path / "python", f"127.0.0.1:{port}")
    assert (
        f"127.0.0.1:{port} does not answer" in info.value.message and "ray start --head" in info.value.message
    )


# -- `_configure`'s keys, where DMR puts vLLM's (pkg/inference/backend.go: VLLMConfig) and llama.cpp's ------


class _Engine:
    def __init__(self, name: str) -> None:
        self.name = name

    def validate_runtime_flags(self, flags: list[str]) -> None:
        return None


def configure(engine: str, **body: object) -> ModelSettings:
    request = ConfigureRequest.model_validate({"model": "ai/x", **body})
    return settings_from_request(request, None, _Engine(engine), None)  # type: ignore[arg-type]


def test_configure_keys_for_the_layouts(tmp_path: Path) -> None:
    settings = configure(
        "vllm",
        vllm={"tensor-parallel-size": 2, "pipeline-parallel-size": 1, "ray-address": "10.0.0.1"},
    )
    own = settings.of(VllmSettings)
    assert (own.tensor_parallel_size, own.pipeline_parallel_size) == (2, None)
    assert own.ray_address == "10.0.0.1:6379"
    store = SettingsStore(tmp_path)
    store.put("vllm", ID, Mode.COMPLETION, settings)
    persisted = json.loads((tmp_path / (ID[7:] + ".json")).read_text())["vllm/completion"]
    assert persisted == {"tensor_parallel_size": 2, "ray_address": "10.0.0.1:6379"}
    stored = store.get("vllm", ID, Mode.COMPLETION)
    assert stored is not None and stored.runner_settings().of(VllmSettings).ray_address == "10.0.0.1:6379"
    cleared = configure("vllm", vllm={"ray-address": ""})
    assert cleared.of(VllmSettings).ray_address is None and cleared.engines == ()
    workers = configure("llama.cpp", llamacpp={"rpc": "10.0.0.2:50052"}).of(LlamaCppSettings).rpc_workers
    assert workers == ("10.0.0.2:50052",)


@pytest.mark.parametrize(
    ("engine", "body", "why"),
    [
        ("vllm", {"vllm": {"tensor-parallel-size": 0}}, "from 1 to 1024"),
        ("vllm", {"vllm": {"pipeline-parallel-size": "2"}}, "from 1 to 1024"),
        ("vllm", {"vllm": {"tensor-parallel-size": True}}, "from 1 to 1024"),
        ("vllm", {"vllm": {"ray-address": 6379}}, "HOST:PORT"),
        ("vllm", {"vllm": {"ray-address": "ray://x:1"}}, "Ray Client"),
        ("llama.cpp", {"vllm": {"tensor-parallel-size": 2}}, "vLLM setting"),
        ("vllm", {"llamacpp": {"rpc": ["10.0.0.2:1"]}}, "llama.cpp setting"),
        ("llama.cpp", {"llamacpp": {"rpc": ["nope"]}}, "HOST:PORT"),
    ],
)
def test_bad_configure_keys_are_refused(engine: str, body: dict[str, object], why: str) -> None:
    with pytest.raises(BadRequest, match=why):
        configure(engine, **body)
