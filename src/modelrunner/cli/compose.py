"""`model compose up|down|metadata`: the Docker Compose provider protocol, as DMR implements it
(`cmd/cli/commands/compose.go`; protocol: docker/compose `docs/extension.md`).

Compose runs `docker model compose --project-name=NAME up --model=ai/smollm2 [--context-size=N]
[--runtime-flags=...] SERVICE` and reads JSON lines from stdout: `info` and `error` messages, and `setenv`
ones that become `<SERVICE>_URL` and `<SERVICE>_MODEL` in the services that depend on it. Nothing else may
reach stdout. Ours also sends `<SERVICE>_API_KEY` when the model runner needs a key.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from modelrunner.cli.common import client

Message = dict[str, str]


def send(kind: str, message: str) -> None:
    """One protocol message, as DMR's CLI marshals it (compact Go JSON, one line)."""
    from modelrunner.artifact import gojson  # here, not at the top: `model --help` builds every verb's parser

    print(gojson.dumps_text({"type": kind, "message": message}), flush=True)


def _parameters(parameters: list[tuple[str, str, bool, str, str | None]]) -> list[dict[str, Any]]:
    out = []
    for name, description, required, kind, default in parameters:
        item: dict[str, Any] = {"name": name, "description": description, "required": required, "type": kind}
        if default:
            item["default"] = default
        out.append(item)
    return out


# `compose up`'s flags as DMR declares them (name, description, required, pflag type, default)
UP_PARAMETERS = [
    ("backend", "inference backend to use", False, "string", "llama.cpp"),
    ("context-size", "context size for the model", False, "int64", "-1"),
    ("model", "model to use", True, "stringArray", "[]"),
    ("runtime-flags", "raw runtime flags to pass to the inference engine", False, "string", None),
    ("speculative-draft-model", "draft model for speculative decoding", False, "string", None),
    (
        "speculative-min-acceptance-rate",
        "minimum acceptance rate for speculative decoding",
        False,
        "float64",
        "0",
    ),
    ("speculative-num-tokens", "number of tokens to predict speculatively", False, "int", "0"),
]


def cmd_metadata(_: argparse.Namespace) -> None:
    """DMR prints the metadata with json.Marshal and no newline."""
    from modelrunner.artifact import gojson

    metadata = {
        "description": "Docker Model Runner",
        "up": {"parameters": _parameters(UP_PARAMETERS)},
        "down": {"parameters": None},
    }
    sys.stdout.write(gojson.dumps_text(metadata))


def _known(daemon: Any, model: str) -> bool:
    """DMR's test: the name equals a model's ID or one of its tags as the store lists them; we also ask the
    store, which resolves `ai/x`, `x` and `x:latest` alike (so a model already there is not pulled again)."""
    from modelrunner.errors import DaemonError

    for listed in daemon.list_models():
        if model == listed.id or model in listed.tags:
            return True
    try:
        daemon.get_model(model)
        return True
    except DaemonError as exc:
        if exc.status_code != 404:
            raise
        return False


def _pull(daemon: Any, model: str) -> None:
    """Pull with progress as `info` lines (DMR's simple printer); an error ends the pull."""
    from modelrunner.cli.distribution import DownloadTally, pull_events
    from modelrunner.errors import DaemonError

    tally = DownloadTally()
    for event in pull_events(daemon, model):
        kind = event.get("type")
        if kind == "error":
            raise DaemonError(500, str(event.get("message")))
        if kind == "warning":
            send("info", f"Warning: {event.get('message')}")
        elif kind == "progress":  # DMR's compose drops the success message (its Pull's finalMessage)
            send("info", tally.line(event))


def models_url(daemon: Any, explicit: bool) -> str:
    """The OpenAI base URL for the services: where containers reach the daemon (DMR's moby case: its
    bridge gateway address), else the URL this CLI uses (DMR's manual case)."""
    from modelrunner.cli.engines import endpoints
    from modelrunner.errors import DaemonError

    try:
        info = daemon.engines_info()
    except DaemonError:
        info = None
    _, endpoint, _ = endpoints(daemon, explicit, info)
    return endpoint.removesuffix("v1/") + "engines/v1/"


def cmd_up(args: argparse.Namespace) -> int:
    from modelrunner import config
    from modelrunner.cli.common import UsageError
    from modelrunner.errors import ModelRunnerError

    if not args.model:  # MarkFlagRequired("model"): cobra refuses before RunE, nothing on stdout
        raise UsageError('required flag(s) "model" not set')
    send("info", "Initializing model runner...")
    try:
        daemon = client(quiet=True)
        for model in args.model:
            if not _known(daemon, model):
                _pull(daemon, model)
    except ModelRunnerError as exc:
        send("error", f"Failed to pull model: {exc.message}")
        return 1
    send("setenv", "MODEL=" + ",".join(args.model))
    if args.context_size is not None and args.context_size > 0:
        send("info", f"Setting context size to {args.context_size}")
    if args.runtime_flags:
        send("info", "Setting raw runtime flags to " + args.runtime_flags)
    speculative: dict[str, Any] | None = None
    if (
        args.speculative_draft_model
        or args.speculative_num_tokens > 0
        or args.speculative_min_acceptance_rate > 0
    ):
        speculative = {"draft_model": args.speculative_draft_model}
        if args.speculative_num_tokens > 0:
            speculative["num_tokens"] = args.speculative_num_tokens
        if args.speculative_min_acceptance_rate > 0:
            speculative["min_acceptance_rate"] = args.speculative_min_acceptance_rate
        send("info", f"Enabling speculative decoding with draft model: {args.speculative_draft_model}")
    for model in args.model:
        request: dict[str, Any] = {"model": model}
        if args.context_size is not None:  # DMR sends it when the flag is given
            request["context-size"] = args.context_size
        if args.runtime_flags:
            request["raw-runtime-flags"] = args.runtime_flags
        if speculative:
            request["speculative"] = speculative
        try:
            daemon.configure(request)
        except ModelRunnerError as exc:
            send(
                "error",
                f"failed to configure backend for model {model} with context-size "
                f"{args.context_size if args.context_size is not None else -1} and runtime-flags "
                f"{args.runtime_flags}: {exc.message}",
            )
            return 1
        send("info", "Successfully configured backend for model " + model)
    target = config.client_target()
    send("setenv", "URL=" + models_url(daemon, target.explicit))
    if daemon.api_key:
        send("setenv", "API_KEY=" + daemon.api_key)
    return 0


def cmd_down(_: argparse.Namespace) -> int:
    return 0  # as DMR: nothing to release on down


def add_commands(commands: Any) -> None:
    import argparse as _argparse

    # hidden, as DMR's: a parser added without `help` is left out of `model --help`'s list (argparse
    # prints help=SUPPRESS as the word "==SUPPRESS==")
    compose = commands.add_parser("compose")
    compose.add_argument("--project-name", help="compose project name (unused by model)")
    events = compose.add_subparsers(title="events", metavar="EVENT")

    up = events.add_parser("up")
    up.add_argument("service", nargs="?", help="the Compose service name (Compose passes it)")
    up.add_argument("--model", action="append", default=[], help="model to use")
    up.add_argument("--context-size", type=int, default=None, help="context size for the model")
    up.add_argument("--runtime-flags", default="", help="raw runtime flags to pass to the inference engine")
    up.add_argument("--backend", default="llama.cpp", help="inference backend to use")
    up.add_argument("--speculative-draft-model", default="", help="draft model for speculative decoding")
    up.add_argument("--speculative-num-tokens", type=int, default=0, help="tokens to predict speculatively")
    up.add_argument(
        "--speculative-min-acceptance-rate", type=float, default=0.0, help="minimum acceptance rate"
    )
    up.add_argument("--project-name", dest="project_name_up", help=_argparse.SUPPRESS)
    up.set_defaults(handler=cmd_up)

    down = events.add_parser("down")
    down.add_argument("service", nargs="?")
    down.add_argument("--project-name", dest="project_name_down", help=_argparse.SUPPRESS)
    down.set_defaults(handler=cmd_down)

    metadata = events.add_parser("metadata", help="Metadata for Docker Compose")
    metadata.set_defaults(handler=cmd_metadata)
