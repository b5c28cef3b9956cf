"""install-runner's and uninstall-runner's DMR flags, parsed and acted on. DMR runs a container with them;
here --host/--port/--tls*/--debug/--proxy-cert are the settings of the `model serve` the install starts,
--llama-server-version the engine version asked of the daemon, --gpu rocm|musa|cann a clear refusal.

Follows: `cmd/cli/commands/install-runner.go` (runInstallOrStart: `unknown GPU specification: %q`),
`utils.go` (addRunnerFlags), `uninstall-runner.go` (--images), `pkg/standalone/containers.go`
(CreateControllerContainer: the proxy certificate added to the container's CA store, DO_NOT_TRACK).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from modelrunner.cli import build_parser, engines


class _Client:
    """What the verbs ask of the daemon, recorded."""

    def __init__(self) -> None:
        self.installs: list[dict[str, Any]] = []

    def install_backend(self, backend: str, **kwargs: Any) -> list[dict[str, Any]]:
        self.installs.append({"backend": backend, **kwargs})
        return [{"type": "success", "message": f"{backend} is installed", "status": "Running"}]

    def uninstall_backend(self, backend: str) -> dict[str, str]:
        return {"message": f"Uninstalled {backend} backend"}


@pytest.fixture
def daemon(monkeypatch: pytest.MonkeyPatch) -> _Client:
    stub = _Client()
    monkeypatch.setattr(engines, "client", lambda: stub)
    settings = ("PORT", "EXTRA_LISTEN", "TLS_ENABLED", "TLS_PORT", "TLS_CERT", "TLS_KEY", "LOG_LEVEL")
    for name in ("MODEL_RUNNER_HOST", "SSL_CERT_FILE", *(f"MODEL_RUNNER_{s}" for s in settings)):
        monkeypatch.setenv(name, "")  # recorded, so that what the verb sets is undone
        monkeypatch.delenv(name)
    return stub


def _run(*words: str) -> None:
    args = build_parser("model", words[0]).parse_args(list(words))
    args.handler(args)


def test_runner_flags_are_the_started_daemons_settings(daemon: _Client, tmp_path: Path) -> None:
    """addRunnerFlags: each flag becomes the environment the auto-started `model serve` reads."""
    cert = tmp_path / "proxy.pem"
    cert.write_text("-----BEGIN CERTIFICATE-----\nproxy\n-----END CERTIFICATE-----\n")
    _run(
        *("install-runner", "--host", "0.0.0.0", "--port", "13434", "--tls", "--tls-port", "13444"),
        *("--tls-cert", str(tmp_path / "c.pem"), "--tls-key", str(tmp_path / "k.pem"), "--debug"),
        *("--proxy-cert", str(cert), "--do-not-track", "--llama-server-version", "latest"),
    )
    assert os.environ["MODEL_RUNNER_PORT"] == "13434"
    assert os.environ["MODEL_RUNNER_EXTRA_LISTEN"] == "0.0.0.0:13434"
    assert os.environ["MODEL_RUNNER_TLS_ENABLED"] == "true"
    assert os.environ["MODEL_RUNNER_TLS_PORT"] == "13444"
    assert os.environ["MODEL_RUNNER_TLS_CERT"] == str(tmp_path / "c.pem")
    assert os.environ["MODEL_RUNNER_TLS_KEY"] == str(tmp_path / "k.pem")
    assert os.environ["MODEL_RUNNER_LOG_LEVEL"] == "debug"
    bundle = Path(os.environ["SSL_CERT_FILE"]).read_text()
    assert bundle.endswith(cert.read_text()) and bundle.count("BEGIN CERTIFICATE") > 1  # added to the usual
    assert daemon.installs == [{"backend": "llama.cpp", "gpu": "auto", "version": "latest", "force": False}]


def test_defaults_change_nothing(daemon: _Client) -> None:
    _run("install-runner", "--backend", "vllm", "--llama-server-version", "b1")
    assert "MODEL_RUNNER_PORT" not in os.environ and "MODEL_RUNNER_EXTRA_LISTEN" not in os.environ
    assert daemon.installs == [{"backend": "vllm", "gpu": "auto", "version": None, "force": False}]


def test_a_named_daemon_keeps_its_settings(
    daemon: _Client, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """DMR: a runner already running is left as it is (existingRunnerOptionsHint); said here too."""
    monkeypatch.setenv("MODEL_RUNNER_HOST", "http://127.0.0.1:1")
    _run("reinstall-runner", "--port", "13434", "--debug")
    assert "MODEL_RUNNER_PORT" not in os.environ and "MODEL_RUNNER_LOG_LEVEL" not in os.environ
    assert "The requested runner options were not applied" in capsys.readouterr().err
    assert daemon.installs[0]["force"] is True


def test_gpu_words(daemon: _Client, capsys: pytest.CaptureFixture[str]) -> None:
    """runInstallOrStart's `unknown GPU specification: %q`; rocm, musa and cann refused naming the lack."""
    from modelrunner.cli import main

    with pytest.raises(SystemExit) as bad:
        main(["install-runner", "--gpu", "tpu"])
    assert (bad.value.code, capsys.readouterr().err) == (1, 'unknown GPU specification: "tpu"\n')
    for kind, lack in (("rocm", "AMD ROCm (HIP)"), ("musa", "Moore Threads MUSA"), ("cann", "Huawei Ascend")):
        with pytest.raises(SystemExit) as refused:
            main(["install-runner", "--gpu", kind])
        assert refused.value.code == 1
        assert f"--gpu {kind} needs a llama.cpp built for {lack}" in capsys.readouterr().err
    assert daemon.installs == []


def test_uninstall_images(daemon: _Client, capsys: pytest.CaptureFixture[str]) -> None:
    _run("uninstall-runner", "--images")
    assert capsys.readouterr().out == (
        "Uninstalled llama.cpp backend\n"
        "No images to remove: this model runner runs no containers (cached engine builds stay)\n"
    )
