"""Engine verbs: install-runner, reinstall-runner, uninstall-runner, status."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from modelrunner.cli.common import client

GPU_CHOICES = ("auto", "none", "cuda", "vulkan")


def _install(args: argparse.Namespace, force: bool) -> None:
    from modelrunner.errors import DaemonError

    for event in client().install_backend(args.backend, gpu=args.gpu, force=force):
        kind, message = event.get("type"), str(event.get("message", ""))
        if kind == "error":
            raise DaemonError(500, message)
        if kind == "success":
            status = event.get("status")
            print(f"{message} ({status})" if status else message)
        else:
            print(message, flush=True)


def cmd_install_runner(args: argparse.Namespace) -> None:
    _install(args, force=False)


def cmd_reinstall_runner(args: argparse.Namespace) -> None:
    _install(args, force=True)


def cmd_uninstall_runner(args: argparse.Namespace) -> None:
    result = client().uninstall_backend(args.backend)
    print(result["message"])


def engine_line(name: str, engine: dict[str, Any], platform: str) -> str:
    """`llama.cpp: running llama.cpp version: b11434`, `mlx: not supported on linux`, ..."""
    state, detail = engine.get("state"), engine.get("detail") or ""
    if state == "Running":
        version = engine.get("version")
        return f"{name}: running {name} version: {version}" if version else f"{name}: running {name}"
    if not engine.get("supported", True):
        return f"{name}: not supported on {platform}"
    if state == "Not Installed":
        hint = detail if "not yet available" in detail else f"run: model install-runner --backend {name}"
        return f"{name}: not installed ({hint})"
    if state == "Installing":
        return f"{name}: installing"
    return f"{name}: error: {detail}" if detail else f"{name}: error"


def cmd_status(args: argparse.Namespace) -> int:
    from modelrunner.client import connect
    from modelrunner.errors import DaemonError

    try:
        daemon = connect(autostart=False)
        info = daemon.engines_info()
    except DaemonError as exc:
        if exc.status_code != 0:
            raise
        if args.json:
            print(json.dumps({"running": False}))
        print(
            "The model runner is not running. Start it with: model start-runner "
            "(any other command, e.g. model ls, also starts it)",
            file=sys.stderr,
        )
        return 1
    engines: dict[str, dict[str, Any]] = info["engines"]
    accelerator: dict[str, Any] = info["accelerator"]
    if args.json:
        document = {
            "running": True,
            "backends": {name: engine["status"] for name, engine in engines.items()},
            "kind": "modelrunner",
            "endpoint": f"{daemon.base_url}/engines/v1/",
            "endpointHost": daemon.base_url,
            "accelerator": accelerator,
            "clusters": daemon.cluster(),
        }
        print(json.dumps(document, indent=2))
        return 0
    print(f"The model runner is running at {daemon.base_url}")
    for name, engine in engines.items():
        print(engine_line(name, engine, info.get("platform", "this platform")))
    print(f"accelerator: {accelerator['kind']} ({accelerator['name']})")
    for line in cluster_lines(daemon.cluster()):
        print(line)
    return 0


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
    for name, help_text, handler in verbs:  # same flags as DMR's install-runner where they apply here
        parser = commands.add_parser(name, help=help_text, description=help_text)
        parser.add_argument("--backend", default="llama.cpp", help="engine to install (default llama.cpp)")
        parser.add_argument(
            "--gpu", default="auto", choices=GPU_CHOICES, help="accelerator to build for (default auto)"
        )
        parser.set_defaults(handler=handler)

    uninstall = commands.add_parser("uninstall-runner", help="Remove an installed inference engine.")
    uninstall.add_argument("--backend", default="llama.cpp", help="engine to remove (default llama.cpp)")
    uninstall.set_defaults(handler=cmd_uninstall_runner)

    status = commands.add_parser("status", help="Show whether the model runner runs, and its engines.")
    status.add_argument("--json", action="store_true", help="as JSON (DMR's fields plus the accelerator)")
    status.set_defaults(handler=cmd_status)
