"""`model context create|ls|use|rm|inspect`: named model runner endpoints, shared with DMR's CLI
(`cmd/cli/commands/context.go`; the store is modelrunner/contexts.py). Every other verb talks to the
active context's daemon unless MODEL_RUNNER_HOST is set."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from modelrunner.cli.common import DmrArgs, UsageError, takes


def cmd_create(args: argparse.Namespace) -> None:
    from modelrunner.contexts import Context, ContextStore

    if not args.host:
        raise UsageError("--host is required")
    parts = urlsplit(args.host)
    if not parts.scheme or not parts.netloc:
        raise UsageError("invalid --host URL: must include scheme and host, e.g. http://192.168.1.100:12434")
    if parts.scheme not in ("http", "https"):
        raise UsageError(f'invalid --host URL: unsupported scheme "{parts.scheme}" (must be http or https)')
    ca_cert = ""
    if args.tls_ca_cert:
        path = Path(args.tls_ca_cert).expanduser().absolute()
        try:
            path.read_bytes()
        except OSError as exc:
            raise UsageError(f"--tls-ca-cert: cannot read {str(path)!r}: {exc.strerror or exc}") from None
        ca_cert = str(path)
    ContextStore().create(
        Context(
            name=args.name,
            host=args.host,
            tls=args.tls,
            tls_skip_verify=args.tls_skip_verify,
            tls_ca_cert=ca_cert,
            description=args.description or "",
            api_key=args.api_key or None,
        )
    )
    print(f'Context "{args.name}" created.')


def cmd_use(args: argparse.Namespace) -> None:
    from modelrunner.contexts import ContextStore

    ContextStore().use(args.name)
    print(f'Current context is now "{args.name}".')


def cmd_ls(_: argparse.Namespace) -> None:
    from modelrunner.cli.dmrformat import go_table
    from modelrunner.contexts import DEFAULT_CONTEXT, ContextStore

    store = ContextStore()
    contexts, active = store.list(), store.active()
    if os.environ.get("MODEL_RUNNER_HOST"):
        host = os.environ["MODEL_RUNNER_HOST"]
        print(f'Warning: MODEL_RUNNER_HOST="{host}" overrides the active context.', file=sys.stderr)
    rows = [
        [
            DEFAULT_CONTEXT,
            "(auto-detect)",
            "Auto-detected Docker context",
            "*" if active == DEFAULT_CONTEXT else "",
        ]
    ]
    rows += [[name, c.host, c.description, "*" if active == name else ""] for name, c in contexts.items()]
    sys.stdout.write(go_table(["NAME", "HOST", "DESCRIPTION", "CURRENT"], rows))


def cmd_rm(args: argparse.Namespace) -> int:
    from modelrunner.contexts import ContextStore
    from modelrunner.errors import ModelRunnerError

    store = ContextStore()
    failed = []
    for name in args.names:
        try:
            store.remove(name)
            print(f'Context "{name}" removed.')
        except ModelRunnerError as exc:
            failed.append(f"{name}: {exc.message}")
    for line in failed:
        print(f"Error: {line}", file=sys.stderr)
    if failed:
        # context.go: each `Error: NAME: cause`, then RunE's error, which DMR's main prints as it is
        print("one or more contexts could not be removed", file=sys.stderr)
        return 1
    return 0


def cmd_inspect(args: argparse.Namespace) -> None:
    """DMR's `context inspect`: `[{name, host, tls, description, createdAt}]`, four-space JSON; a
    context's API key is never printed."""
    from modelrunner.artifact import gojson
    from modelrunner.cli.dmrformat import standard_json
    from modelrunner.contexts import DEFAULT_CONTEXT, ContextStore

    store = ContextStore()
    results: list[dict[str, Any]] = []
    for name in args.names:
        if name == DEFAULT_CONTEXT:
            results.append(
                {
                    "name": DEFAULT_CONTEXT,
                    "host": "(auto-detect)",
                    "tls": {"enabled": False},
                    "description": "Auto-detected Docker context",
                    "createdAt": gojson.ZERO_TIME,
                }
            )
            continue
        context = store.get(name)
        shown = {"name": name, **context.to_json()}
        if shown.pop("apiKey", None):
            shown["apiKey"] = "(set)"
        results.append(shown)
    sys.stdout.write(standard_json(results))


def add_commands(commands: Any) -> None:
    context = commands.add_parser("context", help="Manage named model runner endpoints (contexts).")
    verbs = context.add_subparsers(title="commands", metavar="COMMAND")

    create = verbs.add_parser("create", help="Create a named model runner context.")
    create.add_argument("name", metavar="NAME", nargs="?")
    takes(
        create, DmrArgs("context create", "NAME", "name", cobra=("exact", 1))
    )  # context.go: cobra's own Args
    create.add_argument("--host", help="model runner API base URL (e.g. http://192.168.1.100:12434)")
    create.add_argument("--tls", action="store_true", help="use TLS for this context")
    create.add_argument("--tls-skip-verify", action="store_true", help="skip TLS certificate verification")
    create.add_argument(
        "--tls-ca-cert", metavar="PATH", help="CA certificate (PEM) to verify the server with"
    )
    create.add_argument("--description", help="a description of this context")
    create.add_argument(
        "--api-key", metavar="KEY", help="API key of that model runner (stored in the context file, 0600)"
    )
    create.set_defaults(handler=cmd_create)

    use = verbs.add_parser("use", help='Set the active context ("default": the local model runner).')
    use.add_argument("name", metavar="NAME", nargs="?")
    takes(use, DmrArgs("context use", "NAME", "name", cobra=("exact", 1)))
    use.set_defaults(handler=cmd_use)

    listing = verbs.add_parser("ls", aliases=["list"], help="List contexts.")
    listing.set_defaults(handler=cmd_ls)

    rm = verbs.add_parser("rm", aliases=["remove"], help="Remove one or more contexts.")
    rm.add_argument("names", nargs="*", metavar="NAME")
    takes(rm, DmrArgs("context rm", "NAME [NAME...]", "names", at_least=True, cobra=("min", 1)))
    rm.set_defaults(handler=cmd_rm)

    inspect = verbs.add_parser("inspect", help="Show one or more contexts as JSON.")
    inspect.add_argument("names", nargs="*", metavar="NAME")
    takes(inspect, DmrArgs("context inspect", "NAME [NAME...]", "names", at_least=True, cobra=("min", 1)))
    inspect.set_defaults(handler=cmd_inspect)

    context.set_defaults(handler=lambda _: context.print_help())
