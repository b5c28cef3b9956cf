"""`model launch [APP] [-- APP_ARGS...]`: a coding agent (Claude Code, Codex, OpenCode) or a web UI (Open
WebUI, AnythingLLM) set up to use the model runner, as DMR's `cmd/cli/commands/launch.go` and `opencode.go`:
the same apps, environment variables, docker command, config files and texts.

Beyond DMR: the runner's API key (MODEL_RUNNER_API_KEY or the context's) replaces DMR's placeholder key, so
a runner that requires one is usable, and reaches a container through its environment, never its command
line (which every local user can read); `claude` also gets CLAUDE_CODE_ATTRIBUTION_HEADER=0, no token-count
reminder and, with `--model`, every model Claude Code asks for is the local one, with its context window;
`codex` (which reads no OPENAI_* base URL since 0.17x) gets a model provider in a config of its own
(CODEX_HOME in the runner's home); with `--model`, a coding agent is started only once the daemon says the
model's chat template can render tools (each agent sends tools on every request); a container app fails
early with the reason when no container engine answers; a host app replaces this process (exec), so the
terminal, signals and exit status are the app's own.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any, NamedTuple

from modelrunner.cli.common import DmrArgs, UsageError, takes

OPENAI_PATH_SUFFIX = "/engines/v1"  # DMR's openaiPathSuffix
DUMMY_API_KEY = "sk-docker-model-runner"  # DMR's dummyAPIKey: its runner takes any key
HOST_DOCKER_INTERNAL = "host.docker.internal"
USAGE = "[APP] [-- APP_ARGS...]"


class Runner(NamedTuple):
    """What an app is told: the runner's base URL (no path), the key to send, the model asked for and its
    context window (when the daemon was asked: see `model_facts`)."""

    url: str
    api_key: str
    model: str = ""
    context: int | None = None


EnvFn = Callable[[Runner], list[str]]


def openai_env(suffix: str) -> EnvFn:
    """DMR's openaiEnv: every name the OpenAI clients read, the base URL with `suffix` appended."""

    def env(runner: Runner) -> list[str]:
        endpoint = runner.url + suffix
        return [
            f"OPENAI_API_BASE={endpoint}",
            f"OPENAI_BASE_URL={endpoint}",
            f"OPENAI_API_BASE_URL={endpoint}",
            f"OPENAI_API_KEY={runner.api_key}",
            f"OPEN_AI_KEY={runner.api_key}",  # AnythingLLM reads this one
        ]

    return env


# The model settings Claude Code reads: the main loop's, the small/fast side calls' (the old name and the
# Haiku alias that replaced it), the other aliases `/model` offers, and sub-agents'.
CLAUDE_MODEL_VARIABLES = (
    "ANTHROPIC_MODEL",
    "ANTHROPIC_SMALL_FAST_MODEL",
    "ANTHROPIC_DEFAULT_OPUS_MODEL",
    "ANTHROPIC_DEFAULT_SONNET_MODEL",
    "ANTHROPIC_DEFAULT_HAIKU_MODEL",
    "CLAUDE_CODE_SUBAGENT_MODEL",
)


def anthropic_env(runner: Runner) -> list[str]:
    """DMR's anthropicEnv, and: no attribution header (Claude Code's per-request billing block in the system
    prompt would change the prompt's first bytes on every turn, so the engine's prompt cache never hits), no
    `<total_tokens>` reminder (a count that changes every turn, in the prompt: the same loss), and the
    model's context window (Claude Code reads CLAUDE_CODE_MAX_CONTEXT_TOKENS for a model it does not know;
    otherwise it assumes 1M tokens and compacts far too late)."""
    env = [
        f"ANTHROPIC_BASE_URL={runner.url}/anthropic",
        f"ANTHROPIC_API_KEY={runner.api_key}",
        "CLAUDE_CODE_ATTRIBUTION_HEADER=0",
        "CLAUDE_CODE_TOTAL_TOKENS_REMINDER=off",
    ]
    if runner.model:
        env += [f"{name}={runner.model}" for name in CLAUDE_MODEL_VARIABLES]
    if runner.context:
        env += [f"CLAUDE_CODE_MAX_CONTEXT_TOKENS={runner.context}"]
    return env


CODEX_PROVIDER = "modelrunner"


def codex_home() -> str:
    """Codex's own config folder for the runner (never the user's ~/.codex, whose provider stays theirs)."""
    from modelrunner import config

    return str(config.runner_home() / "codex")


def codex_env(runner: Runner) -> list[str]:
    """DMR's variables (for what else reads them) and CODEX_HOME: Codex 0.17x ignores OPENAI_BASE_URL and
    takes its provider from $CODEX_HOME/config.toml (`write_codex_config`)."""
    return [*openai_env("/v1")(runner), f"CODEX_HOME={codex_home()}"]


def toml_string(value: str) -> str:
    """A TOML basic string (JSON's escapes are TOML's, for what json.dumps writes)."""
    import json

    return json.dumps(value)


def codex_config(runner: Runner) -> str:
    """config.toml: the runner as a Responses provider, chosen, with the model and its context window. The
    key travels in the environment (`env_key`), never in the file."""
    lines = [f"model_provider = {toml_string(CODEX_PROVIDER)}"]
    if runner.model:
        lines.append(f"model = {toml_string(runner.model)}")
    if runner.context:
        lines.append(f"model_context_window = {runner.context}")
    lines += [
        "",
        f"[model_providers.{CODEX_PROVIDER}]",
        'name = "Docker Model Runner (local)"',
        f"base_url = {toml_string(runner.url + '/v1')}",
        'env_key = "OPENAI_API_KEY"',
        'wire_api = "responses"',
    ]
    return "\n".join(lines) + "\n"


def write_codex_config(runner: Runner) -> None:
    from pathlib import Path

    home = Path(codex_home())
    try:
        home.mkdir(mode=0o700, parents=True, exist_ok=True)
        (home / "config.toml").write_text(codex_config(runner))
    except OSError as exc:
        raise UsageError(f"failed to setup codex: failed to write {home / 'config.toml'}: {exc}") from None


def openwebui_env(runner: Runner) -> list[str]:
    return [*openai_env(OPENAI_PATH_SUFFIX)(runner), "WEBUI_AUTH=false"]


def anythingllm_env(runner: Runner) -> list[str]:
    return [
        "STORAGE_DIR=/app/server/storage",
        "LLM_PROVIDER=docker-model-runner",
        f"DOCKER_MODEL_RUNNER_BASE_PATH={runner.url}",
    ]


def openclaw_instructions(runner: Runner) -> list[str]:
    """DMR's openclawConfigInstructions: openclaw is configured by hand, not through its environment."""
    from modelrunner.artifact.gojson import go_quote

    key = "openclaw config set models.providers.docker-model-runner"
    return [
        f"{key}.baseUrl {go_quote(runner.url + OPENAI_PATH_SUFFIX)}",
        f"{key}.api openai-completions",
        f"{key}.apiKey {runner.api_key}",
    ]


class ContainerApp(NamedTuple):
    image: str
    host_port: int
    container_port: int
    env: EnvFn
    docker_args: tuple[str, ...]  # volumes that keep the app's data between runs


class HostApp(NamedTuple):
    env: EnvFn | None
    instructions: Callable[[Runner], list[str]] | None = None  # for an app configured by hand


CONTAINER_APPS = {
    "anythingllm": ContainerApp(
        "mintplexlabs/anythingllm:latest",
        3001,
        3001,
        anythingllm_env,
        ("-v", "anythingllm_storage:/app/server/storage"),
    ),
    "openwebui": ContainerApp(
        "ghcr.io/open-webui/open-webui:latest",
        3000,
        8080,
        openwebui_env,
        ("-v", "openwebui_data:/app/backend/data"),
    ),
}
HOST_APPS = {
    "opencode": HostApp(openai_env(OPENAI_PATH_SUFFIX)),
    "codex": HostApp(codex_env),
    "claude": HostApp(anthropic_env),
    "openclaw": HostApp(None, openclaw_instructions),
}
SUPPORTED_APPS = sorted([*CONTAINER_APPS, *HOST_APPS])
DESCRIPTIONS = {
    "anythingllm": "RAG platform with Docker Model Runner provider",
    "claude": "Claude Code AI assistant",
    "codex": "Codex CLI",
    "openclaw": "Open Claw AI assistant",
    "opencode": "Open Code AI code editor",
    "openwebui": "Open WebUI for models",
}


def unsupported(app: str) -> str:
    from modelrunner.artifact.gojson import go_quote

    return f"unsupported app {go_quote(app)} (supported: {', '.join(SUPPORTED_APPS)})"


def list_apps(usage_path: str) -> None:
    """DMR's listSupportedApps: a host app not on PATH is marked; a container app needs Docker instead."""
    import shutil

    print("Supported apps:\n")
    for name in SUPPORTED_APPS:
        status = " (not installed)" if name in HOST_APPS and shutil.which(name) is None else ""
        print(f"  {name:<15} {DESCRIPTIONS[name]}{status}")
    print(f"\nUsage: {usage_path} {USAGE}")


def app_words(args: argparse.Namespace) -> tuple[str, list[str]]:
    """The app and its arguments: exactly one word before `--`, the app's arguments after it (DMR's
    ArgsLenAtDash checks, with its texts)."""
    words: list[str] = args.words
    if not args.dashed:
        if len(words) > 1:
            raise UsageError(
                f"unexpected arguments: {' '.join(words[1:])}\nUse '--' to pass extra arguments to the app"
            )
    elif len(words) != 1:
        before = " ".join(words[1:]) if words else "(no app)"
        raise UsageError(f"unexpected arguments before '--': {before}\nUsage: {args.usage_path} {USAGE}")
    return words[0].lower(), list(args.passthrough)


def endpoints(model: str) -> tuple[Runner, Runner, bool]:
    """The runner as host apps and as containers reach it, and whether it was named (MODEL_RUNNER_HOST or a
    context) rather than the local daemon. The URL is the one every verb uses; a container reaches this
    machine's loopback as host.docker.internal (DMR's resolveBaseEndpoints, manual-runner case)."""
    from modelrunner import config

    target = config.client_target()
    if target.base_url.startswith("unix:"):
        raise UsageError(
            f"the model runner is reached through a Unix socket ({target.base_url}); apps need its HTTP "
            "address: set MODEL_RUNNER_HOST to it"
        )
    key = target.api_key or DUMMY_API_KEY
    container_url = target.base_url.replace("localhost", HOST_DOCKER_INTERNAL)
    container_url = container_url.replace("127.0.0.1", HOST_DOCKER_INTERNAL)
    return Runner(target.base_url, key, model), Runner(container_url, key, model), target.explicit


def print_config(app: str, host: Runner, container: Runner, image: str, port: int) -> None:
    """DMR's printAppConfig."""
    if app in CONTAINER_APPS:
        spec = CONTAINER_APPS[app]
        print(f"Configuration for {app} (container app):")
        print(f"  Image:          {image or spec.image}")
        print(f"  Container port: {spec.container_port}")
        print(f"  Host port:      {port or spec.host_port}")
        print("  Environment:")
        for line in spec.env(container):
            print(f"    {line}")
        return
    host_app = HOST_APPS[app]
    print(f"Configuration for {app} (host app):")
    if host_app.env is not None:
        print("  Environment:")
        for line in host_app.env(host):
            print(f"    {line}")
    if host_app.instructions is not None:
        print("  Manual configuration:")
        for line in host_app.instructions(host):
            print(f"    {line}")


def exec_app(program: str, app_args: list[str], env: list[str]) -> None:
    """Replace this process with the app, this environment extended with `env` (later names win)."""
    import os

    environment = dict(os.environ)
    for line in env:
        name, _, value = line.partition("=")
        environment[name] = value
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(program, [program, *app_args], environment)
    except OSError as exc:
        raise UsageError(f"failed to run {' '.join([program, *app_args])}: {exc.strerror}") from None


def docker_run_args(
    spec: ContainerApp, runner: Runner, args: argparse.Namespace, app_args: list[str]
) -> tuple[list[str], list[str]]:
    """DMR's launchContainerApp, `docker run --rm [-d] -p HOST:CONTAINER VOLUMES -e ENV... IMAGE ARGS`, and
    the environment docker itself gets: a variable holding the API key is `-e NAME` in the arguments (any
    local user can read a command line for the container's life), its value in docker's environment."""
    words = ["run", "--rm", *(["-d"] if args.detach else [])]
    words += ["-p", f"{args.port or spec.host_port}:{spec.container_port}", *spec.docker_args]
    secrets = []
    for line in spec.env(runner):
        name, _, value = line.partition("=")
        if value == runner.api_key:
            words += ["-e", name]
            secrets.append(line)
        else:
            words += ["-e", line]
    return [*words, args.image or spec.image, *app_args], secrets


def require_container_engine(app: str) -> str:
    """The docker CLI, once a container engine answers it; otherwise the reason, before any `docker run`."""
    import shutil
    import subprocess

    docker = shutil.which("docker")
    if docker is None:
        raise UsageError(f'{app} runs in a container: "docker" executable not found in PATH; install Docker')
    try:
        info = subprocess.run(
            [docker, "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True, timeout=30
        )
        reason = info.stderr.strip().splitlines()[-1] if info.returncode != 0 and info.stderr.strip() else ""
        answered = info.returncode == 0
    except subprocess.TimeoutExpired:
        answered, reason = False, "docker info did not answer within 30 s"
    if not answered:
        raise UsageError(
            f"{app} runs in a container, and no container engine answers ({reason or 'docker info failed'}); "
            "start Docker and re-run"
        )
    return docker


def launch_container(app: str, runner: Runner, args: argparse.Namespace, app_args: list[str]) -> None:
    words, secrets = docker_run_args(CONTAINER_APPS[app], runner, args, app_args)
    if args.dry_run:
        print(f"Would run: docker {' '.join(words)}")
        for line in secrets:
            print(f"  {line}")
        return
    exec_app(require_container_engine(app), words, secrets)


def launch_host(
    app: str, runner: Runner, explicit: bool, args: argparse.Namespace, app_args: list[str]
) -> None:
    """DMR's launchHostApp, launchOpenCode and launchUnconfigurableHostApp."""
    import shutil

    spec = HOST_APPS[app]
    env = spec.env(runner) if spec.env is not None else []
    if not args.dry_run and shutil.which(app) is None:
        print(f'"{app}" executable not found in PATH.', file=sys.stderr)
        if env:
            print("Configure your app to use:", file=sys.stderr)
            for line in env:
                print(f"  {line}", file=sys.stderr)
        raise UsageError(f"{app} not found; please install it and re-run")
    if spec.instructions is not None:
        print(f"Configure {app} to use Docker Model Runner:")
        print(f"  Base URL: {runner.url}{OPENAI_PATH_SUFFIX}")
        print("  API type: openai-completions")
        print(f"  API key:  {runner.api_key}")
        print("\nExample:")
        for line in spec.instructions(runner):
            print(f"  {line}")
    if args.dry_run:
        print(f"Would run: {app} {' '.join(app_args)}")
        for line in env:
            print(f"  {line}")
        if app == "opencode" and args.model:
            print(f"Would configure opencode with model: {args.model}")
        return
    if args.model and app in CODING_AGENTS:
        runner = prepare_model(app, runner)
        env = spec.env(runner) if spec.env is not None else []
    elif not explicit:
        from modelrunner.cli.common import client

        client().version()  # the local daemon: started now, not at the app's first request
    if app == "codex":
        write_codex_config(runner)
    exec_app(app, app_args, env)


CODING_AGENTS = ("claude", "codex", "opencode")


class ModelFacts(NamedTuple):
    tools: bool  # its chat template can render tools
    context: int | None  # the context window it is served with, when known


def model_facts(model: str) -> ModelFacts:
    """What the daemon says of the model: Ollama's /api/show (`tools` among its capabilities) and the context
    window the engine serves it with: the one `configure` set, else the one it is packaged with, else the
    one it was trained with (llama-server's default, and what a longer one is stretched to serve)."""
    from modelrunner.cli.common import client

    daemon = client()
    shown = daemon.call("POST", "/api/show", payload={"model": model})
    info = shown.get("model_info") or {}
    configured = [entry.config.get("context-size") for entry in daemon.configuration(model)]
    trained = info.get(f"{info.get('general.architecture')}.context_length")
    windows = [*configured, info.get("context_length"), trained]
    served = next((w for w in windows if isinstance(w, int) and not isinstance(w, bool) and w > 0), None)
    return ModelFacts("tools" in (shown.get("capabilities") or []), served)


def prepare_model(app: str, runner: Runner) -> Runner:
    """The model in the store (pulled when missing, as `run` does) and able to take tools (every coding
    agent sends them on every request, so one that cannot would fail at its first); the runner with the
    model's context window; opencode's config files naming the model."""
    from modelrunner.cli.common import client
    from modelrunner.cli.inference import ensure_model

    ensure_model(client(), runner.model)
    facts = model_facts(runner.model)
    if not facts.tools:
        raise UsageError(
            f"{runner.model}'s chat template cannot render tools, which {app} sends with every request: "
            f"pick a model whose template can, e.g. `model launch {app} --model ai/qwen3`"
        )
    runner = runner._replace(context=facts.context)
    if app == "opencode":
        from modelrunner.cli.opencode import write_config, write_state

        try:
            write_config(runner.url, runner.model)
        except OSError as exc:
            raise UsageError(f"failed to setup opencode: failed to write opencode config: {exc}") from None
        try:
            write_state(runner.model)
        except OSError as exc:
            raise UsageError(f"failed to setup opencode: failed to write opencode state: {exc}") from None
    return runner


def cmd_launch(args: argparse.Namespace) -> None:
    if not args.words and not args.passthrough:
        list_apps(args.usage_path)
        return
    app, app_args = app_words(args)
    if app not in CONTAINER_APPS and app not in HOST_APPS:
        raise UsageError(unsupported(app))
    if args.port < 0 or args.port > 65535:
        raise UsageError(f"invalid port {args.port}: a port is 1 to 65535 (0 for the app's default)")
    host, container, explicit = endpoints(args.model)
    if args.config:
        print_config(app, host, container, args.image, args.port)
    elif app in CONTAINER_APPS:
        launch_container(app, container, args, app_args)
    else:
        launch_host(app, host, explicit, args, app_args)


def add_commands(commands: Any) -> None:
    parser = commands.add_parser(
        "launch",
        help="Launch an app configured to use Docker Model Runner",
        description=(
            "Launch an app configured to use Docker Model Runner. Without arguments, lists all supported "
            f"apps. Supported apps: {', '.join(SUPPORTED_APPS)}. Arguments after '--' go to the app."
        ),
    )
    parser.add_argument("words", nargs="*", metavar="APP", help="the app to launch")
    parser.add_argument("--port", type=int, default=0, help="Host port to expose (web UIs)")
    parser.add_argument("--image", default="", help="Override container image for containerized apps")
    parser.add_argument("--detach", action="store_true", help="Run containerized app in background")
    parser.add_argument(
        "--dry-run", action="store_true", help="Print what would be executed without running it"
    )
    parser.add_argument("--config", action="store_true", help="Print configuration without launching")
    parser.add_argument("--model", default="", help="Model to use (for opencode, claude and codex)")
    parser.set_defaults(handler=cmd_launch, accepts_passthrough=True, usage_path=parser.prog)
    takes(parser, DmrArgs("launch", USAGE, "words", at_least=True, counted=False))
