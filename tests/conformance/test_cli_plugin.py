"""`docker model ...` through the real Docker CLI (/usr/local/bin/docker, a client only), and Docker
Compose's invocations of the plugin, hermetically: a temporary DOCKER_CONFIG, a test daemon.

Follows: the Docker CLI plugin protocol (docker/cli `cli-plugins/manager`: `docker-<name>` in
`<config>/cli-plugins`, `docker-cli-plugin-metadata` with SchemaVersion "0.1.0" and a Vendor, the plugin
run with docker's own argv), DMR's `cmd/cli/main.go` (plugin metadata) and `cmd/cli/commands/compose.go`
(the provider: `compose --project-name=P up --model=M ... SERVICE`, JSON messages on stdout, `metadata`);
docker/compose `pkg/compose/plugins.go` (how Compose runs a provider) and `pkg/compose/model.go` (the
`models:` section: `ls --json`, `pull`, `configure [--context-size N] MODEL [-- flags]`, `status --json`,
read with stderr merged).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from modelrunner.cli.plugin import plugin_arguments
from tests.conformance.dmr_daemons import cli_env, package, run_cli
from tests.conformance.gotypes import go_decode
from tests.daemon import free_port
from tests.docker_cli import PLUGIN, docker, plugin_env
from tests.inprocess import InProcessDaemon
from tests.models import write_tiny_gguf
from tests.registry import Registry


@pytest.fixture
def docker_env(fake_daemon: InProcessDaemon, tmp_path: Path) -> dict[str, str]:
    """A Docker config of its own with the plugin installed by `model install-plugin`, the daemon named."""
    return plugin_env(tmp_path, fake_daemon.url)


def test_the_docker_cli_finds_and_lists_the_plugin(docker_env: dict[str, str]) -> None:
    metadata = json.loads(
        subprocess.run([str(PLUGIN), "docker-cli-plugin-metadata"], capture_output=True, text=True).stdout
    )
    assert metadata["SchemaVersion"] == "0.1.0" and metadata["Vendor"] == "modelrunner"
    assert metadata["Version"] == "v1.2.6"  # Compose passes runtime flags to plugins >= 1.0.6
    listing = docker(docker_env, "--help")
    assert any(
        line.split()[:1] == ["model*"] and "Docker Model Runner" in line
        for line in listing.stdout.splitlines()
    )
    usage = docker(docker_env, "model", "--help")
    assert usage.returncode == 0 and usage.stdout.startswith("usage: docker model")
    assert "SUPPRESS" not in usage.stdout and "compose" not in usage.stdout  # hidden, as DMR's (issue 37)


def test_install_plugin_keeps_another_plugin_unless_forced(tmp_path: Path) -> None:
    env = cli_env(tmp_path)
    folder = tmp_path / "docker" / "cli-plugins"
    folder.mkdir(parents=True)
    (folder / "docker-model").write_text("#!/bin/sh\necho docker's own\n")
    kept = run_cli(env, "install-plugin")
    assert kept.returncode == 1 and "--force" in kept.stderr
    assert (folder / "docker-model").read_text().startswith("#!/bin/sh")
    assert run_cli(env, "install-plugin", "--force").returncode == 0
    assert (folder / "docker-model").resolve() == PLUGIN.resolve()
    again = run_cli(env, "install-plugin")
    assert again.returncode == 0 and "already" in again.stdout


def test_docker_s_global_options_are_left_out() -> None:
    assert plugin_arguments(["model", "ls"]) == ["ls"]
    assert plugin_arguments(["--context", "model", "model", "ps"]) == ["ps"]  # a context named "model"
    assert plugin_arguments(["-D", "-l=debug", "--tls", "-H", "unix:///x", "model", "run", "m"]) == [
        "run",
        "m",
    ]
    assert plugin_arguments(["compose", "--project-name=p", "up"]) == ["compose", "--project-name=p", "up"]


def test_the_readme_commands_run_as_docker_model(
    docker_env: dict[str, str], fake_daemon: InProcessDaemon, tmp_path: Path
) -> None:
    """The README's commands, verbatim after `docker`, where they need nothing from the internet (pull and
    push go to a local registry in the Compose test; install-runner builds an engine)."""
    write_tiny_gguf(tmp_path / "m.gguf")
    package(fake_daemon, tmp_path, "gemma3:270m", seed=9)

    def ok(*args: str) -> str:
        result = docker(docker_env, *args, cwd=tmp_path)
        assert result.returncode == 0, (args, result.stderr)
        return result.stdout

    assert ok("model", "package", "--gguf", "./m.gguf", "myorg/m:Q4") == ""  # its steps on stderr
    assert ok("model", "run", "gemma3:270m", "Why is the sky blue?") == "t0 t1 t2 \n"
    listed = ok("model", "ls")
    assert listed.startswith("MODEL NAME") and "myorg/m:Q4" in listed and "gemma3:270m" in listed
    assert json.loads(ok("model", "inspect", "myorg/m:Q4"))["tags"] == ["docker.io/myorg/m:Q4"]
    assert "\nFormat:       gguf\n" in ok("model", "show", "myorg/m:Q4")
    assert "tagged successfully" in ok("model", "tag", "myorg/m:Q4", "myorg/m:copy")
    assert ok("model", "rm", "myorg/m:copy") == "Untagged: docker.io/myorg/m:copy\n"  # as the daemon answers
    assert ok("model", "df").startswith("TYPE    SIZE")
    assert ok("model", "ps").splitlines()[1].startswith("gemma3:270m")
    assert ok("model", "unload", "gemma3:270m") == "Unloaded 1 model(s).\n"
    # DMR's cmd/cli/commands/configure.go RunE returns ConfigureBackend's error and prints nothing
    assert ok("model", "configure", "--context-size", "1024", "gemma3:270m") == ""
    assert ok("model", "status").startswith("Docker Model Runner is running")
    archive = tmp_path / "m.tar"
    ok("model", "export", "myorg/m:Q4", "-o", str(archive))
    ok("model", "rm", "myorg/m:Q4")
    assert "Loaded model" in ok("model", "load", str(archive), "--tag", "myorg/m:Q4")
    ok("model", "purge", "--force")
    assert fake_daemon.http("GET", "/models").json() == []


def test_docker_s_config_option_reaches_the_plugin(docker_env: dict[str, str], tmp_path: Path) -> None:
    """`docker --config DIR model ...`: contexts are read from DIR, as DMR's CLI does."""
    other = tmp_path / "other-config"
    shutil.copytree(tmp_path / "docker", other, symlinks=True)
    created = docker(
        docker_env, "--config", str(other), "model", "context", "create", "x", "--host", "http://h:1"
    )
    assert created.returncode == 0, created.stderr
    assert "x" in json.loads((other / "model" / "contexts.json").read_text())["contexts"]
    assert not (tmp_path / "docker" / "model" / "contexts.json").exists()
    assert docker(docker_env, "--context", "default", "-l", "error", "model", "version").returncode == 0


def compose_plugin(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """As Compose runs a provider or the models section: the plugin binary itself, with its arguments."""
    return subprocess.run([str(PLUGIN), *args], env=env, capture_output=True, text=True, timeout=120)


def messages(stdout: str) -> list[dict[str, str]]:
    return [json.loads(line) for line in stdout.splitlines()]


def test_compose_provider_up_down_metadata(docker_env: dict[str, str], fake_daemon: InProcessDaemon) -> None:
    up = compose_plugin(
        docker_env,
        "compose",
        "--project-name=myapp",
        "up",
        "--model=ai/tiny",
        "--context-size=2048",
        "--runtime-flags=--fake-threads 2",
        "llm",
    )
    assert up.returncode == 0, up.stderr
    assert up.stdout.splitlines()[0] == '{"type":"info","message":"Initializing model runner..."}'
    assert messages(up.stdout)[1:] == [
        {"type": "setenv", "message": "MODEL=ai/tiny"},
        {"type": "info", "message": "Setting context size to 2048"},
        {"type": "info", "message": "Setting raw runtime flags to --fake-threads 2"},
        {"type": "info", "message": "Successfully configured backend for model ai/tiny"},
        {"type": "setenv", "message": f"URL={fake_daemon.url}/engines/v1/"},
    ]
    [entry] = fake_daemon.http("GET", "/engines/_configure").json()
    assert entry["Config"] == {"context-size": 2048, "runtime-flags": ["--fake-threads", "2"]}

    down = compose_plugin(docker_env, "compose", "--project-name=myapp", "down", "llm")
    assert down.returncode == 0 and down.stdout == ""

    metadata = compose_plugin(docker_env, "compose", "metadata")
    assert metadata.stdout == (
        '{"description":"Docker Model Runner","up":{"parameters":['
        '{"name":"backend","description":"inference backend to use","required":false,"type":"string",'
        '"default":"llama.cpp"},'
        '{"name":"context-size","description":"context size for the model","required":false,"type":"int64",'
        '"default":"-1"},'
        '{"name":"model","description":"model to use","required":true,"type":"stringArray","default":"[]"},'
        '{"name":"runtime-flags","description":"raw runtime flags to pass to the inference engine",'
        '"required":false,"type":"string"},'
        '{"name":"speculative-draft-model","description":"draft model for speculative decoding",'
        '"required":false,"type":"string"},'
        '{"name":"speculative-min-acceptance-rate","description":"minimum acceptance rate for speculative '
        'decoding","required":false,"type":"float64","default":"0"},'
        '{"name":"speculative-num-tokens","description":"number of tokens to predict speculatively",'
        '"required":false,"type":"int","default":"0"}'
        ']},"down":{"parameters":null}}'
    )


def test_compose_provider_errors_are_messages(docker_env: dict[str, str]) -> None:
    """compose.go newUpCommand: MarkFlagRequired("model") is cobra's ValidateRequiredFlags, before RunE:
    its error as DMR's main prints it, nothing on stdout; later failures are `error` messages."""
    no_model = compose_plugin(docker_env, "compose", "--project-name=p", "up", "llm")
    assert (no_model.returncode, no_model.stdout) == (1, "")
    assert no_model.stderr == 'required flag(s) "model" not set\n'
    bad = compose_plugin(
        docker_env, "compose", "--project-name=p", "up", "--model=ai/tiny", "--runtime-flags=--x '", "s"
    )
    assert bad.returncode != 0
    last = messages(bad.stdout)[-1]
    assert last["type"] == "error" and "invalid raw-runtime-flags" in last["message"]


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[Registry]:
    running = Registry(tmp_path / "registry").start()
    yield running
    running.stop()


def test_compose_models_section(
    docker_env: dict[str, str], fake_daemon: InProcessDaemon, registry: Registry, tmp_path: Path
) -> None:
    """Compose's `models:` support runs the plugin for `ls --json`, `pull`, `configure`, `status --json`,
    reading `ls` and `status` with stderr merged: their output must be JSON alone."""
    env = {**docker_env, "DOCKER_CONFIG": str(tmp_path / "docker")}
    ref = f"{registry.host}/compose/tiny:v1"
    package(fake_daemon, tmp_path, ref, seed=12)
    assert fake_daemon.http("POST", f"/models/{ref}/push").status_code == 200
    fake_daemon.http("DELETE", f"/models/{ref}").raise_for_status()

    listed = compose_plugin(env, "ls", "--json")
    assert listed.stderr == ""
    go_decode(json.loads(listed.stdout), [{"id": "string", "tags": ["string"], "created": "int"}])
    pulled = compose_plugin(env, "pull", ref)
    assert pulled.returncode == 0, pulled.stderr
    configured = compose_plugin(env, "configure", "--context-size", "4096", ref, "--", "--fake-x", "1")
    assert configured.returncode == 0, configured.stderr
    [entry] = fake_daemon.http("GET", "/engines/_configure").json()
    assert entry["Config"] == {"context-size": 4096, "runtime-flags": ["--fake-x", "1"]}
    status = compose_plugin(env, "status", "--json")
    assert status.stderr == "" and json.loads(status.stdout)["endpoint"] == f"{fake_daemon.url}/v1/"


def test_ls_json_starts_a_daemon_without_a_word_on_stderr(tmp_path: Path) -> None:
    """Compose reads `ls --json` with stderr merged: starting the daemon must not write there."""
    env = cli_env(tmp_path, MODEL_RUNNER_PORT=str(free_port()), MODEL_RUNNER_HOME=str(tmp_path / "home"))
    try:
        listed = compose_plugin(env, "ls", "--json")
        assert listed.returncode == 0 and listed.stderr == "" and json.loads(listed.stdout) == []
    finally:
        assert "has stopped" in run_cli(env, "stop-runner").stdout
