"""llama.cpp RPC workers without a worker: settings, the command line, the local share of memory, the probe's
errors, the worker's command line, and the build's second executable (tests/e2e/test_rpc_gemma.py runs
real workers)."""

from __future__ import annotations

import io
import os
import signal
import socket
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from modelrunner.artifact.gguf import read_gguf
from modelrunner.config import is_loopback_host
from modelrunner.engines import build, llamacpp_memory, rpc_workers
from modelrunner.engines.base import Mode, ModelForEngine, RunnerSettings
from modelrunner.engines.llamacpp import LlamaCppEngine
from modelrunner.engines.llamacpp_settings import LlamaCppSettings
from modelrunner.errors import BadRequest, EngineInstallError, EngineNotInstalled, EngineUnavailable
from modelrunner.scheduler.settings import ModelSettings, SettingsStore
from tests.engine_settings import runner_settings
from tests.models import write_tiny_gguf
from tests.waiting import wait_until

SOCKET = Path("/run/mr/inference-runner-1.sock")
ID = "sha256:" + "b" * 64


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("LLAMA_ARGS", "LLAMA_SERVER_PATH"):
        monkeypatch.delenv(name, raising=False)


def tiny(tmp_path: Path) -> ModelForEngine:
    folder = tmp_path / "bundle" / "model"
    folder.mkdir(parents=True)
    write_tiny_gguf(folder / "model.gguf")
    return ModelForEngine(ID, "ai/tiny", tmp_path / "bundle", "gguf", None, 1)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("10.0.0.2:50052", ["10.0.0.2:50052"]),
        ("10.0.0.2:50052, gpu-box.lan:50053", ["10.0.0.2:50052", "gpu-box.lan:50053"]),
        (["127.0.0.1:1", "localhost:65535"], ["127.0.0.1:1", "localhost:65535"]),
        ("", []),
        ([], []),
    ],
)
def test_workers_are_parsed_and_normalised(value: object, expected: list[str]) -> None:
    assert rpc_workers.parse_workers(value) == expected


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("10.0.0.2", "HOST:PORT"),
        ("10.0.0.2:0", "1 to 65535"),
        ("10.0.0.2:70000", "1 to 65535"),
        ("[::1]:50052", "IPv6"),
        ("a b:50052", "host name"),
        ("x/../y:1", "host name"),
        ("1.2.3.4:5,1.2.3.4:5", "twice"),
        ([1], "HOST:PORT strings"),
        ({"a": 1}, "a list"),
        (",".join(f"10.0.0.{i}:1" for i in range(17)), "at most 16"),
    ],
)
def test_bad_workers_are_refused(value: object, why: str) -> None:
    with pytest.raises(BadRequest, match=why):
        rpc_workers.parse_workers(value)


def test_workers_persist_with_the_model(tmp_path: Path) -> None:
    settings = SettingsStore(tmp_path)
    settings.put(
        "llama.cpp",
        ID,
        Mode.COMPLETION,
        ModelSettings(engines=(LlamaCppSettings(rpc_workers=("10.0.0.2:50052",)),)),
    )
    stored = settings.get("llama.cpp", ID, Mode.COMPLETION)
    assert stored is not None and stored.runner_settings().of(LlamaCppSettings).rpc_workers == (
        "10.0.0.2:50052",
    )
    assert "rpc_workers" not in ModelSettings().to_json()  # nothing stored when none are set


def test_the_command_line_names_the_workers_and_the_spec_checks_them_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = tiny(tmp_path)
    engine = LlamaCppEngine(install_root=tmp_path / "engines")
    monkeypatch.setattr(engine, "server_path", lambda: Path("/opt/llama/llama-server"))
    workers = ("127.0.0.1:1", "127.0.0.1:2")
    spec = engine.launch_spec(
        model, Mode.COMPLETION, runner_settings(LlamaCppSettings, rpc_workers=workers), SOCKET
    )
    assert spec.argv[spec.argv.index("--rpc") + 1] == "127.0.0.1:1,127.0.0.1:2"
    assert spec.layout == {"rpc_workers": ["127.0.0.1:1", "127.0.0.1:2"]}
    assert spec.preflight is not None
    with pytest.raises(EngineUnavailable, match=r"127\.0\.0\.1:1 does not answer"):
        spec.preflight()
    plain = engine.launch_spec(model, Mode.COMPLETION, RunnerSettings(), SOCKET)
    assert "--rpc" not in plain.argv and plain.preflight is None and plain.layout == {}


def test_only_the_local_share_counts_against_the_budget(tmp_path: Path) -> None:
    model = tiny(tmp_path)
    engine = LlamaCppEngine(install_root=tmp_path / "engines")
    info = read_gguf([model.bundle / "model" / "model.gguf"])
    assert len(info.block_tensor_bytes) == info.block_count == 2
    assert info.output_tensor_bytes > 0 and 0 < sum(info.block_tensor_bytes) < info.tensor_data_bytes
    local = RunnerSettings(context_size=512)
    spread = runner_settings(LlamaCppSettings, context_size=512, rpc_workers=("10.0.0.2:50052",))
    assert engine.estimate_memory(model, spread) < engine.estimate_memory(model, local)
    kv = llamacpp_memory.kv_settings([], 512)
    everything_away = llamacpp_memory.local_share(info, kv, None)
    assert everything_away.kv_cache == 0  # KV cells live with their layers, on the workers
    stays = info.size_bytes - sum(info.block_tensor_bytes) - info.output_tensor_bytes
    assert everything_away.weights == stays  # the token embeddings (and the header) stay here
    assert llamacpp_memory.local_share(info, kv, 0) == llamacpp_memory.estimate(info, kv)
    one_layer_away = llamacpp_memory.local_share(info, kv, 1)  # the output layer counts as one
    assert one_layer_away.weights == info.size_bytes - info.output_tensor_bytes
    assert llamacpp_memory.gpu_layers(["-ngl", "999", "-ngl", "7"]) == 7
    assert llamacpp_memory.gpu_layers(["--n-gpu-layers=auto"]) is None


def _silent_listener() -> socket.socket:
    """A port that accepts connections (the backlog does) but never answers: a busy worker."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    return listener


def test_a_worker_that_does_not_answer_is_named() -> None:
    with _silent_listener() as busy:
        port = busy.getsockname()[1]
        with pytest.raises(EngineUnavailable) as info:
            rpc_workers.probe(rpc_workers.Endpoint("127.0.0.1", port), timeout=0.5)
    assert f"127.0.0.1:{port}" in info.value.message and "one model at a time" in info.value.message
    assert info.value.status_code == 503


def test_something_else_on_the_port_is_not_a_worker() -> None:
    refused = pytest.raises(EngineUnavailable, match="did not answer as an RPC worker")
    with _answering(b"HTTP/1.1 400 Bad Request\r\n\r\n") as port, refused:  # e.g. a web server
        rpc_workers.probe(rpc_workers.Endpoint("127.0.0.1", port), timeout=2)


class _answering:
    """A one-connection server that sends `reply` and closes: not an RPC worker."""

    def __init__(self, reply: bytes) -> None:
        import threading

        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(1)
        self.reply = reply
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        with conn:
            conn.recv(64)
            conn.sendall(self.reply)

    def __enter__(self) -> int:
        self.thread.start()
        return int(self.listener.getsockname()[1])

    def __exit__(self, *exc: object) -> None:
        self.thread.join(5)
        self.listener.close()


def test_worker_command_and_memory_cap(tmp_path: Path) -> None:
    binary = tmp_path / "ggml-rpc-server"
    assert rpc_workers.worker_command(binary, "127.0.0.1", 50052, None, False) == [
        str(binary), "--host", "127.0.0.1", "--port", "50052",
    ]  # fmt: skip
    assert rpc_workers.worker_command(binary, "0.0.0.0", 1, 4, True)[-3:] == ["--threads", "4", "--cache"]
    assert rpc_workers.data_limit(1024, 2) == 1024 * 2**20 + rpc_workers.WORKER_OVERHEAD_BYTES + 2 * 8 * 2**20
    assert is_loopback_host("127.0.0.1") and is_loopback_host("localhost")
    assert not is_loopback_host("0.0.0.0") and not is_loopback_host("10.0.0.2")


def test_the_worker_binary_is_found_beside_llama_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    server = tmp_path / "bin" / "llama-server"
    server.parent.mkdir()
    with pytest.raises(EngineNotInstalled, match=r"install-runner --backend llama\.cpp"):
        rpc_workers.find_worker_binary(server)
    (server.parent / "ggml-rpc-server").write_text("")
    assert rpc_workers.find_worker_binary(server) == server.parent / "ggml-rpc-server"


def test_the_build_makes_the_worker_too() -> None:
    spec = build.BuildSpec("none")
    assert "-DGGML_RPC=ON" in spec.cmake_flags
    assert build.TARGETS == ("llama-server", "ggml-rpc-server")
    portable = build.BuildSpec("none", portable=True)
    assert "-DGGML_NATIVE=OFF" in portable.cmake_flags and "portable" in portable.key
    assert portable.key != spec.key


def test_source_extraction_without_tarfile_filters(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Debian 12's Python 3.11.2 (container images) has no tarfile filters: the same refusals by hand."""
    monkeypatch.delattr(tarfile, "data_filter")

    def archive(name: str, member: tarfile.TarInfo, data: bytes = b"") -> Path:
        path = tmp_path / name
        with tarfile.open(path, "w:gz") as tar:
            ok = tarfile.TarInfo("pkg/llama.cpp/CMakeLists.txt")
            ok.size = 1
            tar.addfile(ok, io.BytesIO(b"x"))
            tar.addfile(member, io.BytesIO(data))
        return path

    fine = tarfile.TarInfo("pkg/llama.cpp/LICENSE")
    fine.size = 3
    source = build.extract_llama_cpp(archive("a.tar.gz", fine, b"MIT"), tmp_path / "o1")
    assert (source / "LICENSE").read_text() == "MIT"
    escaping = tarfile.TarInfo("pkg/llama.cpp/../../evil")
    with pytest.raises(EngineInstallError, match="unsafe entry"):
        build.extract_llama_cpp(archive("b.tar.gz", escaping), tmp_path / "o2")
    link = tarfile.TarInfo("pkg/llama.cpp/link")
    link.type = tarfile.SYMTYPE
    link.linkname = "/etc/passwd"
    with pytest.raises(EngineInstallError, match="unsafe entry"):
        build.extract_llama_cpp(archive("c.tar.gz", link), tmp_path / "o3")
    assert not (tmp_path / "o3" / "pkg").exists()


def stand_in_worker(tmp_path: Path, script: str) -> dict[str, str]:
    """The environment of a `model worker` whose ggml-rpc-server (beside LLAMA_SERVER_PATH) is a shell
    script: it writes its arguments and its data limit (KiB) to `ran`, then runs `script`."""
    server = tmp_path / "bin" / "llama-server"
    server.parent.mkdir()
    server.write_text("")
    worker = server.parent / "ggml-rpc-server"
    worker.write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/ran\nulimit -d >> {tmp_path}/ran\n{script}\n')
    worker.chmod(0o755)
    return {**os.environ, "LLAMA_SERVER_PATH": str(server)}


def model_worker(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "modelrunner", "worker", *args]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)


def test_model_worker_warns_beyond_loopback_and_caps_the_worker_s_memory(tmp_path: Path) -> None:
    env = stand_in_worker(tmp_path, "exit 0")
    done = model_worker(env, "--host", "10.0.0.2", "--port", "50053", "--mem", "512", "--threads", "2")
    assert done.returncode == 0, done.stderr
    argv, data_limit = (tmp_path / "ran").read_text().splitlines()
    assert argv == "--host 10.0.0.2 --port 50053 --threads 2"
    assert int(data_limit) * 1024 == rpc_workers.data_limit(512, 2)  # the worker's limit, not the CLI's
    assert (
        "WARNING" in done.stderr
        and "no authentication" in done.stderr
        and "--rpc 10.0.0.2:50053" in done.stderr
    )
    done = model_worker(env)
    assert (tmp_path / "ran").read_text().split()[:4] == [
        "--host",
        "127.0.0.1",
        "--port",
        str(rpc_workers.DEFAULT_PORT),
    ]
    assert "WARNING" not in done.stderr
    refused = model_worker(env, "--port", "0")
    assert refused.returncode == 1  # a usage error: the bare message and exit 1, as DMR (cobra)


@pytest.mark.parametrize(
    ("signum", "words"),
    [
        (
            signal.SIGILL,
            "built for instructions this CPU cannot run; run: model reinstall-runner --backend llama.cpp",
        ),
        (signal.SIGKILL, "killed (SIGKILL), most often by the kernel's out-of-memory killer"),
        (signal.SIGSEGV, "crashed (SIGSEGV)"),
    ],
)
def test_a_worker_that_dies_by_a_signal_is_said_in_words(tmp_path: Path, signum: int, words: str) -> None:
    done = model_worker(stand_in_worker(tmp_path, f"kill -{signal.Signals(signum).name[3:]} $$"))
    assert done.returncode == 128 + signum
    assert done.stderr.splitlines()[-1].startswith("Error: the RPC worker stopped: ")
    assert words in done.stderr


def test_a_worker_stopped_by_its_user_ends_quietly(tmp_path: Path) -> None:
    assert stopped_by(signal.SIGTERM, tmp_path) == 128 + signal.SIGTERM  # passed on, nothing to explain


def test_a_killed_command_takes_its_worker_along(tmp_path: Path) -> None:
    assert stopped_by(signal.SIGKILL, tmp_path) == -signal.SIGKILL  # the worker ends with it (pdeathsig)


def stopped_by(stop: int, tmp_path: Path) -> int:
    """Start `model worker` with a worker that waits, send `stop` to the command: its exit status, once
    the worker has ended too."""
    pid_file = tmp_path / "pid"
    env = stand_in_worker(tmp_path, f"echo $$ > {pid_file}\nexec sleep 60")
    command = subprocess.Popen(
        [sys.executable, "-m", "modelrunner", "worker"], env=env, stderr=subprocess.PIPE, text=True
    )
    wait_until(lambda: pid_file.is_file() and pid_file.read_text().strip(), "the worker to start")
    worker = int(pid_file.read_text())
    command.send_signal(stop)
    _, err = command.communicate(timeout=30)
    assert "Error" not in err
    wait_until(lambda: gone(worker), "the worker to end")
    return command.returncode


def gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"  # ended, unreaped
    except OSError:
        return True
