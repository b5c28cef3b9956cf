"""`model launch` as DMR's CLI runs it: the app list, `--dry-run` and `--config` for each app, the environment
and arguments a real host app gets (a script named `claude`, `codex` or `opencode` on PATH that records
them: the app as the CLI sees it), OpenCode's config files, a container app with no container engine, and
the argument errors (issue 22, item 1).

Follows: `cmd/cli/commands/launch.go` (listSupportedApps, printAppConfig, launchContainerApp,
launchHostApp, launchUnconfigurableHostApp, openaiEnv, anthropicEnv, openwebuiEnv, anythingllmEnv, the
ArgsLenAtDash checks of newLaunchCmd) and `opencode.go` (launchOpenCode, writeOpenCodeConfig,
writeOpenCodeState), with their tests `launch_test.go` and `opencode_test.go`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conformance.dmr_daemons import cli_env, run_cli
from tests.daemon import free_port
from tests.docker_cli import DOCKER, docker, plugin_env
from tests.inprocess import InProcessDaemon
from tests.models import write_tiny_gguf
from tests.waiting import wait_until

KEY = "sk-docker-model-runner"
ALL_APPS = ("anythingllm", "claude", "codex", "openclaw", "opencode", "openwebui")

# The app as the CLI sees it: records its arguments, environment and open descriptors (the listing's own
# among them), exits with LAUNCH_EXIT
APP_SCRIPT = f"""#!{sys.executable}
import json, os, sys
name, fds = os.path.basename(sys.argv[0]), sorted(map(int, os.listdir("/proc/self/fd")))
with open(os.path.join(os.environ["LAUNCH_DUMP"], name + ".json"), "w") as out:
    json.dump({{"argv": sys.argv[1:], "env": dict(os.environ), "fds": fds}}, out)
sys.exit(int(os.environ.get("LAUNCH_EXIT", "0")))
"""


def launch_env(tmp_path: Path, url: str, *apps: str, **extra: str) -> dict[str, str]:
    """A CLI environment whose PATH holds only the recording `apps`, HOME a folder of the test's own."""
    bin_dir, dump, home = tmp_path / "bin", tmp_path / "dump", tmp_path / "user"
    for folder in (bin_dir, dump, home):
        folder.mkdir(exist_ok=True)
    for app in apps:
        script = bin_dir / app
        script.write_text(APP_SCRIPT)
        script.chmod(0o755)
    xdg = {"XDG_CONFIG_HOME": "", "XDG_STATE_HOME": "", **extra}  # unset: OpenCode's files under HOME
    return cli_env(tmp_path, url, PATH=str(bin_dir), HOME=str(home), LAUNCH_DUMP=str(dump), **xdg)


def recorded(tmp_path: Path, app: str) -> dict[str, Any]:
    result: dict[str, Any] = json.loads((tmp_path / "dump" / f"{app}.json").read_text())
    return result


@pytest.fixture
def closed_url() -> str:
    """A runner URL nobody listens on: what does not need the daemon must not contact it."""
    return f"http://127.0.0.1:{free_port()}"


def openai_lines(base: str) -> list[str]:
    return [
        f"OPENAI_API_BASE={base}",
        f"OPENAI_BASE_URL={base}",
        f"OPENAI_API_BASE_URL={base}",
        f"OPENAI_API_KEY={KEY}",
        f"OPEN_AI_KEY={KEY}",
    ]


def codex_lines(tmp_path: Path, url: str) -> list[str]:
    """DMR's variables and Codex's own config folder, in the CLI's runner home."""
    return [*openai_lines(f"{url}/v1"), f"CODEX_HOME={tmp_path / 'cli-home' / 'codex'}"]


def docker_e(line: str) -> str:
    """How `docker run` is given a variable: a secret by name only (its value in docker's environment)."""
    name, _, value = line.partition("=")
    return f"-e {name}" if value == KEY else f"-e {line}"


def test_list_marks_host_apps_missing_from_path(tmp_path: Path, closed_url: str) -> None:
    """listSupportedApps (TestNewLaunchCmdNoArgsListsApps): every app, a host app not on PATH marked."""
    listed = run_cli(launch_env(tmp_path, closed_url, "claude"), "launch")
    assert (listed.returncode, listed.stderr) == (0, "")
    assert listed.stdout == (
        "Supported apps:\n\n"
        "  anythingllm     RAG platform with Docker Model Runner provider\n"
        "  claude          Claude Code AI assistant\n"
        "  codex           Codex CLI (not installed)\n"
        "  openclaw        Open Claw AI assistant (not installed)\n"
        "  opencode        Open Code AI code editor (not installed)\n"
        "  openwebui       Open WebUI for models\n"
        "\nUsage: model launch [APP] [-- APP_ARGS...]\n"
    )


def test_dry_run_prints_what_would_run_and_runs_nothing(tmp_path: Path, closed_url: str) -> None:
    """launchContainerApp / launchHostApp / launchOpenCode with dryRun (TestLaunchContainerAppDryRun,
    TestLaunchHostAppDryRunCodex, TestLaunchHostAppDryRunAnthropic, TestNewLaunchCmdPassthroughArgs)."""
    env = launch_env(tmp_path, closed_url, "claude", "codex", "opencode", "openclaw")
    port = closed_url.rsplit(":", 1)[1]
    container = f"http://host.docker.internal:{port}"
    expected = {
        "openwebui": "Would run: docker run --rm -p 3000:8080 -v openwebui_data:/app/backend/data "
        + " ".join(docker_e(line) for line in [*openai_lines(f"{container}/engines/v1"), "WEBUI_AUTH=false"])
        + f" ghcr.io/open-webui/open-webui:latest\n  OPENAI_API_KEY={KEY}\n  OPEN_AI_KEY={KEY}\n",
        "anythingllm": "Would run: docker run --rm -p 3001:3001 -v anythingllm_storage:/app/server/storage "
        "-e STORAGE_DIR=/app/server/storage -e LLM_PROVIDER=docker-model-runner "
        f"-e DOCKER_MODEL_RUNNER_BASE_PATH={container} mintplexlabs/anythingllm:latest\n",
        "codex": "Would run: codex \n" + "".join(f"  {line}\n" for line in codex_lines(tmp_path, closed_url)),
        "opencode": "Would run: opencode \n"
        + "".join(f"  {line}\n" for line in openai_lines(f"{closed_url}/engines/v1")),
        "claude": f"Would run: claude \n  ANTHROPIC_BASE_URL={closed_url}/anthropic\n"
        f"  ANTHROPIC_API_KEY={KEY}\n  CLAUDE_CODE_ATTRIBUTION_HEADER=0\n"
        "  CLAUDE_CODE_TOTAL_TOKENS_REMINDER=off\n",
        "openclaw": "Configure openclaw to use Docker Model Runner:\n"
        f"  Base URL: {closed_url}/engines/v1\n  API type: openai-completions\n"
        f"  API key:  {KEY}\n\nExample:\n"
        f'  openclaw config set models.providers.docker-model-runner.baseUrl "{closed_url}/engines/v1"\n'
        "  openclaw config set models.providers.docker-model-runner.api openai-completions\n"
        f"  openclaw config set models.providers.docker-model-runner.apiKey {KEY}\n"
        "Would run: openclaw \n",
    }
    for app, text in expected.items():
        shown = run_cli(env, "launch", app, "--dry-run")
        assert (shown.returncode, shown.stderr, shown.stdout) == (0, "", text), app
    overridden = run_cli(
        env, "launch", "openwebui", "--dry-run", "--port", "9999", "--image", "custom/image:v2", "--detach",
        "--", "--extra-flag",
    )  # fmt: skip
    assert overridden.returncode == 0, overridden.stderr
    assert overridden.stdout.startswith("Would run: docker run --rm -d -p 9999:8080 ")
    assert overridden.stdout.splitlines()[0].endswith(" custom/image:v2 --extra-flag")
    with_model = run_cli(env, "launch", "opencode", "--dry-run", "--model", "ai/qwen3", "--", "-m", "x")
    assert with_model.stdout.startswith("Would run: opencode -m x\n")
    assert with_model.stdout.endswith("Would configure opencode with model: ai/qwen3\n")
    claude = run_cli(env, "launch", "claude", "--dry-run", "--model", "ai/qwen3")
    for name in ("ANTHROPIC_MODEL", "ANTHROPIC_SMALL_FAST_MODEL", "ANTHROPIC_DEFAULT_HAIKU_MODEL"):
        assert f"  {name}=ai/qwen3\n" in claude.stdout
    assert not any((tmp_path / "dump").iterdir())  # nothing ran
    assert not (tmp_path / "user" / ".config").exists()  # no opencode config written


def test_config_prints_each_apps_configuration(tmp_path: Path, closed_url: str) -> None:
    """printAppConfig (TestPrintAppConfigContainerApp, ...Overrides, TestPrintAppConfigHostApp)."""
    env = launch_env(tmp_path, closed_url)
    port = closed_url.rsplit(":", 1)[1]
    webui = run_cli(env, "launch", "openwebui", "--config", "--port", "9999")
    assert (webui.returncode, webui.stderr) == (0, "")
    assert webui.stdout == (
        "Configuration for openwebui (container app):\n"
        "  Image:          ghcr.io/open-webui/open-webui:latest\n"
        "  Container port: 8080\n"
        "  Host port:      9999\n"
        "  Environment:\n"
        + "".join(f"    {line}\n" for line in openai_lines(f"http://host.docker.internal:{port}/engines/v1"))
        + "    WEBUI_AUTH=false\n"
    )
    anything = run_cli(env, "launch", "anythingllm", "--config", "--image", "custom/image:v2")
    assert (
        "  Image:          custom/image:v2\n  Container port: 3001\n  Host port:      3001\n"
        in anything.stdout
    )
    assert anything.stdout.endswith(f"    DOCKER_MODEL_RUNNER_BASE_PATH=http://host.docker.internal:{port}\n")
    codex = run_cli(env, "launch", "codex", "--config")
    assert codex.stdout == "Configuration for codex (host app):\n  Environment:\n" + "".join(
        f"    {line}\n" for line in codex_lines(tmp_path, closed_url)
    )
    claude = run_cli(env, "launch", "CLAUDE", "--config")  # DMR lower-cases the app
    assert claude.stdout == (
        "Configuration for claude (host app):\n  Environment:\n"
        f"    ANTHROPIC_BASE_URL={closed_url}/anthropic\n    ANTHROPIC_API_KEY={KEY}\n"
        "    CLAUDE_CODE_ATTRIBUTION_HEADER=0\n    CLAUDE_CODE_TOTAL_TOKENS_REMINDER=off\n"
    )
    openclaw = run_cli(env, "launch", "openclaw", "--config")
    assert "  Manual configuration:\n    openclaw config set" in openclaw.stdout
    assert "Environment" not in openclaw.stdout


def test_host_apps_run_with_the_runner_environment(tmp_path: Path, closed_url: str) -> None:
    """launchHostApp / runExternal / withEnv: the app runs with this environment plus DMR's variables, and
    the words after `--` as its arguments (TestNewLaunchCmdPassthroughArgs); the CLI becomes the app, so
    its exit status is the app's."""
    env = launch_env(tmp_path, closed_url, "claude", "codex", "opencode", KEPT="yes", LAUNCH_EXIT="3")
    for app, args in (("claude", ["-p", "hi there"]), ("codex", []), ("opencode", ["--", "-x"])):
        ran = run_cli(env, "launch", app, "--", *args)
        assert (ran.returncode, ran.stdout, ran.stderr) == (3, "", ""), app
        seen = recorded(tmp_path, app)
        assert seen["argv"] == args
        assert seen["env"]["KEPT"] == "yes"
    claude = recorded(tmp_path, "claude")["env"]
    assert claude["ANTHROPIC_BASE_URL"] == f"{closed_url}/anthropic"
    assert claude["ANTHROPIC_API_KEY"] == KEY
    assert claude["CLAUDE_CODE_ATTRIBUTION_HEADER"] == "0"
    assert "ANTHROPIC_MODEL" not in claude
    for app, base in (("codex", f"{closed_url}/v1"), ("opencode", f"{closed_url}/engines/v1")):
        seen = recorded(tmp_path, app)["env"]
        assert {line.split("=", 1)[0]: seen[line.split("=", 1)[0]] for line in openai_lines(base)} == dict(
            line.split("=", 1) for line in openai_lines(base)
        )


def test_the_runners_api_key_replaces_the_placeholder(tmp_path: Path, closed_url: str) -> None:
    """Beyond DMR: a runner that requires a key (MODEL_RUNNER_API_KEY) gets it from the app."""
    env = launch_env(tmp_path, closed_url, "codex", MODEL_RUNNER_API_KEY="s3cret")
    assert run_cli(env, "launch", "codex").returncode == 0
    assert recorded(tmp_path, "codex")["env"]["OPENAI_API_KEY"] == "s3cret"


def test_claude_with_a_model_asks_for_it_everywhere(fake_daemon: InProcessDaemon, tmp_path: Path) -> None:
    """Beyond DMR: `--model` is the model of Claude Code's main loop, side calls and sub-agents."""
    env = launch_env(tmp_path, fake_daemon.url, "claude")
    ran = run_cli(env, "launch", "claude", "--model", "tiny")
    assert ran.returncode == 0, ran.stderr
    assert recorded(tmp_path, "claude")["fds"] == [0, 1, 2, 3]  # the daemon's connections left nothing open
    seen = recorded(tmp_path, "claude")["env"]
    for name in (
        "ANTHROPIC_MODEL",
        "ANTHROPIC_SMALL_FAST_MODEL",
        "ANTHROPIC_DEFAULT_OPUS_MODEL",
        "ANTHROPIC_DEFAULT_SONNET_MODEL",
        "ANTHROPIC_DEFAULT_HAIKU_MODEL",
        "CLAUDE_CODE_SUBAGENT_MODEL",
    ):
        assert seen[name] == "tiny", name


def test_opencode_files_as_opencode_go_writes_them(fake_daemon: InProcessDaemon, tmp_path: Path) -> None:
    """writeOpenCodeConfig and writeOpenCodeState (TestWriteOpenCodeConfig): fresh files, then the user's
    own settings kept while the `dmr` provider's base URL and the recent models are updated."""
    env = launch_env(tmp_path, fake_daemon.url, "opencode")
    ran = run_cli(env, "launch", "opencode", "--model", "tiny")
    assert ran.returncode == 0, ran.stderr
    config = tmp_path / "user" / ".config" / "opencode" / "opencode.json"
    state = tmp_path / "user" / ".local" / "state" / "opencode" / "model.json"
    assert config.read_text() == (
        "{\n"
        '  "$schema": "https://opencode.ai/config.json",\n'
        '  "provider": {\n'
        '    "dmr": {\n'
        '      "models": {\n'
        '        "tiny": {\n'
        '          "_launch": true,\n'
        '          "name": "tiny"\n'
        "        }\n"
        "      },\n"
        '      "name": "Docker Model Runner (local)",\n'
        '      "npm": "@ai-sdk/openai-compatible",\n'
        '      "options": {\n'
        f'        "baseURL": "{fake_daemon.url}/v1"\n'
        "      }\n"
        "    }\n"
        "  }\n"
        "}"
    )
    assert state.read_text() == (
        '{\n  "favorite": [],\n  "recent": [\n    {\n      "modelID": "tiny",\n      "providerID": "dmr"\n'
        '    }\n  ],\n  "variant": {}\n}'
    )
    config.write_text(
        json.dumps(
            {
                "theme": "a<b",
                "provider": {
                    "other": {"n": 1.0},
                    "dmr": {"name": "mine", "options": {"baseURL": "http://old", "timeout": 5}},
                },
            }
        )
    )
    recent = [{"providerID": "dmr", "modelID": f"m{i}"} for i in range(10)]
    state.write_text(
        json.dumps({"recent": [recent[0], {"providerID": "dmr", "modelID": "tiny"}, *recent[1:]]})
    )
    assert run_cli(env, "launch", "opencode", "--model", "tiny").returncode == 0
    kept = json.loads(config.read_text())
    assert kept["theme"] == "a<b" and '"a\\u003cb"' in config.read_text()  # Go's HTML escaping
    assert kept["provider"]["other"] == {"n": 1}
    assert kept["provider"]["dmr"] == {
        "name": "mine",
        "options": {"baseURL": f"{fake_daemon.url}/v1", "timeout": 5},
        "models": {"tiny": {"name": "tiny", "_launch": True}},
    }
    assert json.loads(state.read_text()) == {
        "recent": [{"providerID": "dmr", "modelID": "tiny"}, *recent[:9]],
        "favorite": [],
        "variant": {},
    }


def test_container_app_without_a_container_engine(tmp_path: Path, closed_url: str) -> None:
    """launchContainerApp's `docker run` fails where no engine answers: the reason comes first, exit 1."""
    env = launch_env(tmp_path, closed_url, DOCKER_HOST=f"unix://{tmp_path}/no-docker.sock")
    missing = run_cli(env, "launch", "openwebui")
    assert (missing.returncode, missing.stdout) == (1, "")
    assert missing.stderr == (
        'openwebui runs in a container: "docker" executable not found in PATH; install Docker\n'
    )
    (tmp_path / "bin" / "docker").symlink_to(DOCKER)
    unanswered = run_cli(env, "launch", "anythingllm", "--detach")
    assert (unanswered.returncode, unanswered.stdout) == (1, "")
    assert unanswered.stderr == (
        "anythingllm runs in a container, and no container engine answers (Cannot connect to the Docker "
        f"daemon at unix://{tmp_path}/no-docker.sock. Is the docker daemon running?); "
        "start Docker and re-run\n"
    )


def test_a_host_app_not_installed(tmp_path: Path, closed_url: str) -> None:
    """launchHostApp without the executable (TestLaunchHostAppNotFound): how to configure it by hand."""
    gone = run_cli(launch_env(tmp_path, closed_url), "launch", "codex")
    assert (gone.returncode, gone.stdout) == (1, "")
    assert gone.stderr == (
        '"codex" executable not found in PATH.\nConfigure your app to use:\n'
        + "".join(f"  {line}\n" for line in codex_lines(tmp_path, closed_url))
        + "codex not found; please install it and re-run\n"
    )


def test_unknown_apps_and_stray_words(tmp_path: Path, closed_url: str) -> None:
    """newLaunchCmd's errors (TestNewLaunchCmdDispatchUnsupportedApp, ...RejectsExtraArgsWithoutDash,
    ...RejectsExtraArgsBeforeDash): the text alone on stderr, exit 1, nothing run."""
    env = launch_env(tmp_path, closed_url, "claude")
    cases = {
        ("bogus",): f'unsupported app "bogus" (supported: {", ".join(ALL_APPS)})\n',
        (
            "opencode",
            "extra-arg",
        ): "unexpected arguments: extra-arg\nUse '--' to pass extra arguments to the app\n",
        ("claude", "extra", "--", "--help"): (
            "unexpected arguments before '--': extra\nUsage: model launch [APP] [-- APP_ARGS...]\n"
        ),
        ("claude", "--port", "70000"): "invalid port 70000: a port is 1 to 65535 (0 for the app's default)\n",
    }
    for words, text in cases.items():
        failed = run_cli(env, "launch", *words)
        assert (failed.returncode, failed.stdout, failed.stderr) == (1, "", text), words
    assert not any((tmp_path / "dump").iterdir())


def test_docker_model_launch(fake_daemon: InProcessDaemon, tmp_path: Path) -> None:
    """The same verb through the real Docker CLI and the plugin: DMR's command path in its texts, the app
    run with the runner's environment."""
    env = {**plugin_env(tmp_path, fake_daemon.url), **launch_env(tmp_path, fake_daemon.url, "claude")}
    env["PATH"] = f"{env['PATH']}{os.pathsep}{Path(DOCKER).parent}"
    listed = docker(env, "model", "launch")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.endswith("\nUsage: docker model launch [APP] [-- APP_ARGS...]\n")
    ran = docker(env, "model", "launch", "claude", "--", "--help")
    assert ran.returncode == 0, ran.stderr
    seen = recorded(tmp_path, "claude")
    assert seen["argv"] == ["--help"]
    assert seen["env"]["ANTHROPIC_BASE_URL"] == f"{fake_daemon.url}/anthropic"


def test_a_model_that_cannot_be_pulled_stops_the_launch(fake_daemon: InProcessDaemon, tmp_path: Path) -> None:
    """ensureModelExists: a model not in the store is pulled first; when the pull fails the app is not run
    and OpenCode's files are not written."""
    env = launch_env(tmp_path, fake_daemon.url, "opencode", "claude")
    for app in ("opencode", "claude"):
        failed = run_cli(env, "launch", app, "--model", f"127.0.0.1:{free_port()}/nowhere/model:v1")
        assert failed.returncode == 1, app
        assert failed.stdout.startswith("Unable to find model"), app
        assert failed.stderr.startswith("Failed to pull model: "), app  # desktop.go's words
    assert not any((tmp_path / "dump").iterdir())
    assert not (tmp_path / "user" / ".config").exists()


# A `docker` that answers `docker info` and, for `docker run`, says it started and then waits: the container
# app as every local user's `ps` would see it while it runs.
FAKE_DOCKER = f"""#!{sys.executable}
import os, sys, time
if sys.argv[1:2] == ["info"]:
    print("27.0.0")
    sys.exit(0)
open(os.environ["LAUNCH_DUMP"] + "/docker-started", "w").close()
time.sleep(60)
"""


def test_a_container_app_gets_the_key_through_its_environment(tmp_path: Path, closed_url: str) -> None:
    """Issue 36 item 3: `docker run` is given the variables holding the API key by name only, their values in
    docker's environment; no local user reads the key in its command line."""
    secret = "sk-secret-from-the-context-7f3a"
    env = launch_env(tmp_path, closed_url, MODEL_RUNNER_API_KEY=secret)
    docker_script = tmp_path / "bin" / "docker"
    docker_script.write_text(FAKE_DOCKER)
    docker_script.chmod(0o755)
    started = tmp_path / "dump" / "docker-started"
    launched = subprocess.Popen(
        [sys.executable, "-m", "modelrunner", "launch", "openwebui", "--detach"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        wait_until(started.exists, "the stand-in docker run started", 60)
        # the CLI became `docker` (exec): the same process, its command line and environment as ps shows them
        argv = Path(f"/proc/{launched.pid}/cmdline").read_bytes().split(b"\0")
        environ = Path(f"/proc/{launched.pid}/environ").read_bytes().split(b"\0")
    finally:
        launched.kill()
        launched.communicate(timeout=30)
    argv = argv[argv.index(str(docker_script).encode()) + 1 :]  # the interpreter's own words dropped
    assert argv[:4] == [b"run", b"--rm", b"-d", b"-p"]
    assert not any(secret.encode() in word for word in argv), argv
    assert argv[argv.index(b"OPENAI_API_KEY") - 1] == b"-e"
    assert b"OPEN_AI_KEY" in argv and b"WEBUI_AUTH=false" in argv
    assert f"OPENAI_API_KEY={secret}".encode() in environ
    assert f"OPEN_AI_KEY={secret}".encode() in environ
    dry = run_cli(env, "launch", "openwebui", "--dry-run")
    assert dry.stdout.splitlines()[0].count(secret) == 0


def package_with_template(daemon: InProcessDaemon, tmp_path: Path, name: str, template: str) -> None:
    gguf = write_tiny_gguf(tmp_path / f"{name}.gguf", chat_template=False, seed=7)
    (tmp_path / f"{name}.jinja").write_text(template)
    body = {"target": name, "gguf": str(gguf), "chat_template": str(tmp_path / f"{name}.jinja")}
    response = daemon.http("POST", "/models/package", json=body)
    assert response.status_code == 201, response.text


def test_a_model_that_cannot_take_tools_stops_every_coding_agent(
    fake_daemon: InProcessDaemon, tmp_path: Path
) -> None:
    """Issue 34: each coding agent sends tools on every request, so a model whose chat template cannot render
    them would fail at the first one; `launch` says so in one sentence, exit 1, and starts nothing."""
    no_tools = "{% for message in messages %}{{ message['content'] }}{% endfor %}"
    package_with_template(fake_daemon, tmp_path, "notools", no_tools)
    shown = fake_daemon.http("POST", "/api/show", json={"model": "notools"}).json()
    assert "tools" not in shown["capabilities"]
    assert "tools" in fake_daemon.http("POST", "/api/show", json={"model": "tiny"}).json()["capabilities"]
    env = launch_env(tmp_path, fake_daemon.url, "claude", "codex", "opencode")
    for app in ("claude", "codex", "opencode"):
        refused = run_cli(env, "launch", app, "--model", "notools")
        assert (refused.returncode, refused.stdout) == (1, ""), app
        assert refused.stderr == (
            f"notools's chat template cannot render tools, which {app} sends with every request: pick a "
            f"model whose template can, e.g. `model launch {app} --model ai/qwen3`\n"
        )
    assert not any((tmp_path / "dump").iterdir())
    assert not (tmp_path / "user" / ".config").exists()
    assert not (tmp_path / "cli-home" / "codex").exists()


def test_agents_get_the_models_context_window(fake_daemon: InProcessDaemon, tmp_path: Path) -> None:
    """Issue 34: Claude Code gets the model's window (CLAUDE_CODE_MAX_CONTEXT_TOKENS, else it assumes 1M for
    a model it does not know) and no token-count reminder; Codex, which ignores OPENAI_BASE_URL, gets the
    runner as its provider in a config folder of its own (never the user's ~/.codex), with the model and
    its window: the tiny model's trained 512 tokens, then the 2048 `configure` sets."""
    env = launch_env(tmp_path, fake_daemon.url, "claude", "codex")
    (tmp_path / "user" / ".codex").mkdir()
    for app in ("claude", "codex"):
        ran = run_cli(env, "launch", app, "--model", "tiny", "--", "exec", "hi")
        assert (ran.returncode, ran.stderr) == (0, ""), app
    claude = recorded(tmp_path, "claude")["env"]
    assert claude["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] == "512"
    assert claude["CLAUDE_CODE_TOTAL_TOKENS_REMINDER"] == "off"
    codex = recorded(tmp_path, "codex")
    assert codex["argv"] == ["exec", "hi"]
    codex_home = tmp_path / "cli-home" / "codex"
    assert codex["env"]["CODEX_HOME"] == str(codex_home)
    assert (codex_home / "config.toml").read_text() == (
        'model_provider = "modelrunner"\n'
        'model = "tiny"\n'
        "model_context_window = 512\n"
        "\n"
        "[model_providers.modelrunner]\n"
        'name = "Docker Model Runner (local)"\n'
        f'base_url = "{fake_daemon.url}/v1"\n'
        'env_key = "OPENAI_API_KEY"\n'
        'wire_api = "responses"\n'
    )
    assert KEY not in (codex_home / "config.toml").read_text()  # the key stays in the environment
    assert not any((tmp_path / "user" / ".codex").iterdir())
    # a context set with `configure` is the one the engine serves (stretched beyond the trained 512)
    configured = run_cli(env, "configure", "--context-size", "2048", "tiny")
    assert configured.returncode == 0, configured.stderr
    for app in ("claude", "codex"):
        assert run_cli(env, "launch", app, "--model", "tiny").returncode == 0
    assert recorded(tmp_path, "claude")["env"]["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] == "2048"
    assert "model_context_window = 2048\n" in (codex_home / "config.toml").read_text()


def test_opencode_files_where_opencode_reads_them(fake_daemon: InProcessDaemon, tmp_path: Path) -> None:
    """Beyond DMR (which writes under ~ whatever XDG says): with XDG_CONFIG_HOME and XDG_STATE_HOME set,
    OpenCode reads its config and state there (xdg-basedir), so `launch` writes them there."""
    config_home, state_home = tmp_path / "xdg-config", tmp_path / "xdg-state"
    xdg = {"XDG_CONFIG_HOME": str(config_home), "XDG_STATE_HOME": str(state_home)}
    env = launch_env(tmp_path, fake_daemon.url, "opencode", **xdg)
    ran = run_cli(env, "launch", "opencode", "--model", "tiny")
    assert ran.returncode == 0, ran.stderr
    config = json.loads((config_home / "opencode" / "opencode.json").read_text())
    assert config["provider"]["dmr"]["models"] == {"tiny": {"name": "tiny", "_launch": True}}
    state = json.loads((state_home / "opencode" / "model.json").read_text())
    assert state["recent"] == [{"providerID": "dmr", "modelID": "tiny"}]
    assert not (tmp_path / "user" / ".config").exists()
