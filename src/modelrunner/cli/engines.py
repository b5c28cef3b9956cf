"""Engine verbs: install-runner, reinstall-runner, uninstall-runner, status."""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO, TypeVar

from modelrunner import config
from modelrunner.cli.common import DmrArgs, UsageError, client, takes

if TYPE_CHECKING:
    from modelrunner.client import Client
    from modelrunner.client_types import EnginesInfo

T = TypeVar("T")

# DMR's --gpu kinds and ours; any other word is DMR's "unknown GPU specification"
GPU_WORDS = ("auto", "none", "cuda", "vulkan", "rocm", "musa", "cann")


def _daemon_settings(args: argparse.Namespace) -> dict[str, str]:
    """What install-runner's runner flags mean for a daemon it starts: DMR runs a container with them; here
    they are the settings (environment) of the `model serve` that the install starts when none runs."""
    settings: dict[str, str] = {}
    if args.port:
        settings["MODEL_RUNNER_PORT"] = str(args.port)
    if args.host not in ("127.0.0.1", "localhost"):  # beyond loopback, as `serve --listen` (API key required)
        settings["MODEL_RUNNER_EXTRA_LISTEN"] = f"{args.host}:{args.port or config.daemon_port()}"
    if args.tls:
        settings["MODEL_RUNNER_TLS_ENABLED"] = "true"
    if args.tls_port:
        settings["MODEL_RUNNER_TLS_PORT"] = str(args.tls_port)
    if args.tls_cert:
        settings["MODEL_RUNNER_TLS_CERT"] = str(Path(args.tls_cert).expanduser().resolve())
    if args.tls_key:
        settings["MODEL_RUNNER_TLS_KEY"] = str(Path(args.tls_key).expanduser().resolve())
    if args.debug:
        settings["MODEL_RUNNER_LOG_LEVEL"] = "debug"
    if args.proxy_cert:
        settings["SSL_CERT_FILE"] = str(_proxy_ca_bundle(Path(args.proxy_cert).expanduser()))
    return settings


def _proxy_ca_bundle(cert: Path) -> Path:
    """The usual CA bundle plus the proxy's certificate (DMR adds it to its container's CA store): the
    daemon's registry and Hugging Face clients trust it through SSL_CERT_FILE."""
    import certifi

    try:
        extra = cert.read_bytes()
    except OSError as exc:
        raise UsageError(f"--proxy-cert: cannot read {cert}: {exc.strerror}") from None
    bundle = config.runner_home() / "proxy-ca-bundle.pem"
    bundle.parent.mkdir(parents=True, exist_ok=True)
    bundle.write_bytes(Path(certifi.where()).read_bytes() + b"\n" + extra)
    return bundle


def _apply_runner_flags(args: argparse.Namespace) -> None:
    """Check --gpu as DMR does, then give a daemon this command starts the runner flags' settings; a
    daemon already running keeps its own, as DMR keeps a running container (said on stderr)."""
    import json

    from modelrunner.engines.gpu import UNBUILT_GPU_KINDS, check_gpu_kind
    from modelrunner.errors import ModelRunnerError

    if args.gpu not in GPU_WORDS:
        raise UsageError(f"unknown GPU specification: {json.dumps(args.gpu)}")
    if args.gpu in UNBUILT_GPU_KINDS:
        try:
            check_gpu_kind(args.gpu)
        except ModelRunnerError as exc:
            raise UsageError(exc.message) from None
    settings = _daemon_settings(args)
    if not settings:
        return
    from modelrunner.server.daemon import read_pid

    target = config.client_target()
    if target.explicit or read_pid() is not None:
        where = target.base_url if target.explicit else "already running"
        print(
            f"The requested runner options were not applied: the model runner is {where}.\n"
            "To start it with them, run `model stop-runner` first.",
            file=sys.stderr,
        )
        return
    os.environ.update(settings)


def install_with_progress(
    daemon: Client,
    backend: str,
    gpu: str = "auto",
    version: str | None = None,
    force: bool = False,
    out: TextIO | None = None,
) -> None:
    """Install an engine through the daemon, printing each progress line as it comes (on `out`, stdout by
    default) and the final status; the install's error line raises DaemonError."""
    from modelrunner.errors import DaemonError

    out = out or sys.stdout
    for event in daemon.install_backend(backend, gpu=gpu, version=version, force=force):
        kind, message = event.get("type"), str(event.get("message", ""))
        if kind == "error":
            raise DaemonError(500, message)
        if kind == "success":
            status = event.get("status")
            print(f"{message} ({status})" if status else message, file=out, flush=True)
        else:
            print(message, file=out, flush=True)


def _install(args: argparse.Namespace, force: bool) -> None:
    _apply_runner_flags(args)
    version = (args.llama_server_version or None) if args.backend == "llama.cpp" else None
    install_with_progress(client(), args.backend, args.gpu, version, force)


# DMR's switch for the install its CLI does on first use (ensureStandaloneRunnerAvailable)
NO_AUTO_INSTALL = "MODEL_RUNNER_NO_AUTO_INSTALL"
# The fix a "not installed" answer names (Engine.install_hint): the engine a plain install would make usable.
# A broken engine names reinstall-runner instead, and one that cannot be installed here names none: neither
# is installed unasked.
_INSTALL_HINT = re.compile(r"\bmodel install-runner --backend (\S+)")


def engine_to_install(message: str) -> str | None:
    """The engine a "not installed" message tells the user to install, if any."""
    found = _INSTALL_HINT.search(message)
    return found.group(1).rstrip(".,;)") if found else None


def with_engine_installed(daemon: Client, action: Callable[[], T]) -> T:
    """`action` (a load or a first request); when the daemon answers that the engine it needs is not
    installed, install that engine with its progress on stderr, then try once more. DMR's CLI does the same
    on first use (cmd/cli/commands/install-runner.go ensureStandaloneRunnerAvailable, called by run.go
    before it runs a model; MODEL_RUNNER_NO_AUTO_INSTALL turns it off); a cached build makes it seconds."""
    from modelrunner.client_errors import EngineNotInstalled

    try:
        return action()
    except EngineNotInstalled as exc:
        backend = engine_to_install(exc.message)
        if backend is None or os.environ.get(NO_AUTO_INSTALL):
            raise
    print(
        f"{backend} is not installed yet: installing it now (once; set {NO_AUTO_INSTALL}=1 to turn this off)",
        file=sys.stderr,
        flush=True,
    )
    install_with_progress(daemon, backend, out=sys.stderr)
    return action()


def cmd_install_runner(args: argparse.Namespace) -> None:
    _install(args, force=False)


def cmd_reinstall_runner(args: argparse.Namespace) -> None:
    _install(args, force=True)


def cmd_uninstall_runner(args: argparse.Namespace) -> None:
    from modelrunner.cli.models import confirm_removing_every_model

    if args.models and not confirm_removing_every_model(args.force):
        return  # declined: nothing is removed
    daemon = client()
    result = daemon.uninstall_backend(args.backend)
    print(result["message"])
    from modelrunner.cli.storage import engine_cache_note, runner_is_here

    if runner_is_here():  # what stays on this machine, on stderr (stdout is DMR's)
        print(engine_cache_note(), file=sys.stderr)
    if args.images:  # DMR: remove the runner's container images
        print("No images to remove: this model runner runs no containers (cached engine builds stay)")
    if args.models:  # DMR: also remove the model storage
        daemon.unload([], True, None)
        daemon.purge()
        print("Removed every model from the store")


STATUS_ORDER = ("Running", "Error", "Not Installed", "Installing")


def parse_status(text: str) -> tuple[str, str]:
    """DMR's inference.ParseStatus: "Running: llama.cpp b11434" -> ("Running", "llama.cpp b11434")."""
    if not text:
        return "Not Installed", ""
    for prefix in STATUS_ORDER:
        if text == prefix:
            return prefix, ""
        if text.startswith(prefix + ": "):
            return prefix, text[len(prefix) + 2 :]
    return "Error", text


def backend_status_table(backends: dict[str, str]) -> str:
    """DMR's backendStatusTable: Running, then Error, Not Installed, Installing; by name within each."""
    from modelrunner.cli.dmrformat import go_table

    rows = [[name, *parse_status(text)] for name, text in backends.items()]
    rank = {kind: i for i, kind in enumerate(STATUS_ORDER)}
    rows.sort(key=lambda row: (rank.get(row[1], len(STATUS_ORDER)), row[0]))
    return go_table(["BACKEND", "STATUS", "DETAILS"], rows)


def endpoints(daemon: Client, explicit: bool, info: EnginesInfo | None) -> tuple[str, str, str]:
    """(kind, endpoint, endpointHost) of DMR's `status --json`: the OpenAI base URL containers use and the
    one this machine uses. A local daemon with an extra listen address (a Docker bridge gateway) is
    reached there by containers, as DMR on Docker Engine is; otherwise both are the URL the CLI uses."""
    from modelrunner.config import is_loopback_host

    host_endpoint = daemon.base_url + "/v1/"
    listed = info.extra_listen if info else []
    extra = [a for a in listed if not is_loopback_host(a.rsplit(":", 1)[0].strip("[]"))]
    if extra and not explicit:
        return "Docker Engine", f"http://{extra[0]}/v1/", host_endpoint
    return "Docker Engine (Manual Install)", host_endpoint, host_endpoint


def _next_steps(*steps: str) -> str:
    bold = ("\x1b[1m", "\x1b[0m") if sys.stdout.isatty() else ("", "")
    return f"\n{bold[0]}What's next:{bold[1]}\n" + "".join(f"    {step}\n" for step in steps)


def cmd_status(args: argparse.Namespace) -> int:
    """DMR's `status`: "Docker Model Runner is running" and a BACKEND/STATUS/DETAILS table, or `--json`
    with running, backends, kind, endpoint and endpointHost (what Compose reads for its models)."""
    from modelrunner import config
    from modelrunner.client import Client
    from modelrunner.errors import DaemonError

    target = config.client_target()
    daemon = Client.for_target(target)
    try:
        daemon.list_models()
        backends = daemon.engines_status()
        running = True
    except DaemonError as exc:
        if exc.status_code != 503 and (exc.status_code or target.explicit):
            # desktop.go Status: DMR's "not running" is its 503 (ours: also no local daemon started);
            # a runner named but unreachable, or another answer, is an error
            cause = (
                f"unexpected status code: {exc.status_code}"
                if exc.status_code
                else f"error querying /models: {exc.message}"
            )
            if exc.status_code == 401:  # ours after DMR's words: what to do about the key
                cause += f" ({exc.message})"
            print(f"Failed to get Docker Model Runner status: {cause}", file=sys.stderr)
            return 1
        backends, running = {}, False
    if args.json:
        info = None
        if running:
            with contextlib.suppress(DaemonError):
                info = daemon.engines_info()
        kind, endpoint, endpoint_host = endpoints(daemon, target.explicit, info)
        document: dict[str, Any] = {
            "running": running,
            "backends": dict(sorted(backends.items())) if running else None,
            "kind": kind,
            "endpoint": endpoint,
            "endpointHost": endpoint_host,
        }
        clusters = _clusters(daemon) if running else {}
        if clusters:  # ours, only when some model is spread over a Ray cluster (DMR's reader skips it)
            document["clusters"] = clusters
        from modelrunner.artifact import gojson  # only here: the everyday `status` leaves it unloaded

        print(gojson.dumps_text(document))
        return 0
    if not running:
        print("Docker Model Runner is not running")
        sys.stdout.write(_next_steps("Start it → model start-runner (any other command also starts it)"))
        return 1
    print("Docker Model Runner is running\n")
    sys.stdout.write(backend_status_table(backends))
    for line in cluster_lines(_clusters(daemon)):  # ours: engines spread over a Ray cluster
        print(line)
    return 0


def _clusters(daemon: Client) -> dict[str, list[dict[str, Any]]]:
    """The engines' Ray clusters, or none from a runner without the route (DMR's own daemon: a 404)."""
    from modelrunner.errors import DaemonError

    try:
        return daemon.cluster()
    except DaemonError as exc:
        if exc.status_code == 404:
            return {}
        raise


def cluster_lines(clusters: dict[str, list[dict[str, Any]]]) -> list[str]:
    """`ray cluster 10.0.0.1:6379: 2 nodes, 16 CPUs, 2 GPUs (…free)` and a line per node."""
    lines = []
    for engine, found in clusters.items():
        for cluster in found:
            head = f"{engine}: ray cluster {cluster.get('address')}"
            if cluster.get("error"):
                lines.append(f"{head}: error: {cluster['error']}")
                continue
            nodes = cluster.get("nodes", [])
            total = cluster.get("resources", {}).get("total", {})
            free = cluster.get("resources", {}).get("available", {})
            alive = [n for n in nodes if n.get("alive")]
            amounts = ", ".join(
                f"{free.get(kind, 0):g}/{total[kind]:g} {kind}s free"
                for kind in ("CPU", "GPU")
                if kind in total
            )
            lines.append(f"{head}: {len(alive)} node(s) alive of {len(nodes)}, {amounts}")
            for node in nodes:
                state = "alive" if node.get("alive") else "dead"
                resources = node.get("resources", {})
                devices = ", ".join(f"{resources[k]:g} {k}" for k in ("CPU", "GPU") if k in resources)
                here = " (this machine's driver)" if node.get("driver") else ""
                name = f"{str(node.get('node_id', ''))[:12]} {node.get('address')}"
                lines.append(f"  node {name}: {state}, {devices}{here}")
    return lines


def add_commands(commands: Any) -> None:
    verbs = (
        (
            "install-runner",
            "Install an inference engine (llama.cpp is built once, then cached).",
            cmd_install_runner,
        ),
        (
            "reinstall-runner",
            "Install an inference engine again, over the installed one.",
            cmd_reinstall_runner,
        ),
    )
    for name, help_text, handler in verbs:  # DMR's install-runner flags, as they apply to this daemon
        parser = commands.add_parser(name, help=help_text, description=help_text)
        parser.add_argument("--backend", default="llama.cpp", help="engine to install (default llama.cpp)")
        parser.add_argument(
            "--gpu",
            default="auto",
            help="accelerator to build for: auto|none|cuda|vulkan (rocm|musa|cann: DMR's, "
            "not built here) (default auto)",
        )
        parser.add_argument(
            "--llama-server-version", default="", help="llama.cpp version to install (this runner builds one)"
        )
        group = parser.add_argument_group("settings of the daemon this command starts when none runs")
        group.add_argument(
            "--host", default="127.0.0.1", help="also listen on this address (default 127.0.0.1)"
        )
        group.add_argument("--port", type=int, default=0, help="daemon port (default 12434)")
        group.add_argument("--tls", action="store_true", help="also serve HTTPS (MODEL_RUNNER_TLS_ENABLED)")
        group.add_argument("--tls-port", type=int, default=0, help="HTTPS port (default 12444)")
        group.add_argument("--tls-cert", default="", help="TLS certificate file (generated if not given)")
        group.add_argument("--tls-key", default="", help="TLS private key file (generated if not given)")
        group.add_argument("--debug", action="store_true", help="log at debug level")
        group.add_argument(
            "--proxy-cert", default="", help="CA certificate of a TLS-inspecting proxy to trust"
        )
        group.add_argument(
            "--do-not-track", action="store_true", help="no effect: this model runner tracks no model usage"
        )
        takes(parser, DmrArgs(name, "[OPTIONS]"))
        parser.set_defaults(handler=handler)

    uninstall = commands.add_parser("uninstall-runner", help="Remove an installed inference engine.")
    uninstall.add_argument("--backend", default="llama.cpp", help="engine to remove (default llama.cpp)")
    uninstall.add_argument(
        "--models", action="store_true", help="also remove every model from the store (asks first)"
    )
    uninstall.add_argument("-f", "--force", action="store_true", help="with --models: do not ask")
    uninstall.add_argument("--images", action="store_true", help="no effect: this model runner has no images")
    uninstall.set_defaults(handler=cmd_uninstall_runner)

    status = commands.add_parser("status", help="Show whether the model runner runs, and its engines.")
    status.add_argument("--json", action="store_true", help="Format output in JSON")
    status.set_defaults(handler=cmd_status)
