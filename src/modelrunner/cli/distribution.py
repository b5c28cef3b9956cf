"""`model pull` and `model push`: stream the daemon's progress events and render them.

On a terminal: rich per-layer bars with speed and ETA; otherwise DMR's plain `Downloaded X of Y` lines;
`--json` passes the raw events through. Ctrl-C closes the connection, which cancels the transfer in the daemon
(when no other client watches it) and keeps the partial files for a resume.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from modelrunner.cli.common import DmrArgs, client, takes

# Handlers import what they use when they run (start-up: see cli/__init__.py); errors is loaded already.
from modelrunner.errors import DaemonError, status_line

if TYPE_CHECKING:
    from modelrunner.client import Client

# DMR's handleClientError messages for pull.go and push.go
PULL_FAILURE = "Failed to pull model"
PUSH_FAILURE = "Failed to push model"

Event = dict[str, Any]


class Renderer(Protocol):
    def show(self, event: Event) -> None: ...

    def close(self) -> None: ...


class JsonRenderer:
    def show(self, event: Event) -> None:
        print(json.dumps(event), flush=True)

    def close(self) -> None:
        pass


class DownloadTally:
    """DMR's displayProgressSimple (`cmd/cli/desktop/progress.go`): each progress event is one line, the sum
    of every layer's latest `current` (an event without a layer counts as layer "") against the event's
    `total`, both in go-units' decimal sizes; `Downloaded` for pushes too."""

    def __init__(self) -> None:
        self._layers: dict[str, int] = {}

    def line(self, event: Event) -> str:
        from modelrunner.cli.dmrformat import custom_size

        layer = event.get("layer") or {}
        self._layers[str(layer.get("id") or "")] = int(layer.get("current") or 0)
        done, total = sum(self._layers.values()), int(event.get("total") or 0)
        return f"Downloaded {custom_size(done)} of {custom_size(total)}"


class PlainRenderer:
    """For logs and pipes, as DMR's CLI off a terminal: one line per progress event on stdout (cobra's
    Println, which the Docker plugin framework points at stdout), warnings on stderr as `Warning: ...`."""

    def __init__(self) -> None:
        self._tally = DownloadTally()

    def show(self, event: Event) -> None:
        kind = event.get("type")
        if kind == "progress":
            print(self._tally.line(event), flush=True)
        elif kind == "warning":
            print(f"Warning: {event.get('message')}", file=sys.stderr, flush=True)

    def close(self) -> None:
        pass


class RichRenderer:
    def __init__(self) -> None:
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
        )
        self._tasks: dict[str, Any] = {}
        self._progress.start()

    def show(self, event: Event) -> None:
        layer = event.get("layer") or {}
        layer_id = layer.get("id")
        if event.get("type") in ("error", "success"):
            return  # the caller prints these
        if not layer_id:
            if event.get("message"):
                self._progress.console.print(event["message"])
            return
        task = self._tasks.get(layer_id)
        if task is None:
            task = self._progress.add_task(str(layer_id)[7:19], total=int(layer.get("size") or 0))
            self._tasks[layer_id] = task
        self._progress.update(task, completed=int(layer.get("current") or 0))

    def close(self) -> None:
        self._progress.stop()


def _renderer(as_json: bool) -> Renderer:
    if as_json:
        return JsonRenderer()
    if sys.stdout.isatty():
        return RichRenderer()
    return PlainRenderer()


def render_transfer(
    events: Iterable[Event], as_json: bool, verb: str, failure: str = "Error", final: bool = True
) -> int:
    """Show a pull's or push's events; an error event goes to stderr after `failure` (the verb's DMR
    message); `final=False` leaves out the success message (package prints its own)."""
    renderer = _renderer(as_json)
    failed = False
    message = ""
    try:
        for event in events:
            renderer.show(event)
            if event.get("type") == "success":
                message = str(event.get("message") or "")
            if event.get("type") == "error":
                failed = True
                if not as_json:
                    print(f"{failure}: {event.get('message')}", file=sys.stderr)
    except KeyboardInterrupt:
        renderer.close()
        close = getattr(events, "close", None)
        if close is not None:
            close()  # drops the connection: the daemon cancels and keeps the partial files
        print(f"\n{verb.capitalize()} cancelled; run the same command again to resume.", file=sys.stderr)
        return 130
    renderer.close()
    if not as_json and not failed and final:
        print(message)  # pull.go and push.go: cmd.Println(response)
    return 1 if failed else 0


def _answered_in_dmr_words(events: Iterator[Event], verb: str, model: str) -> Iterator[Event]:
    """desktop.go Pull and Push: an answer other than 200 is `pulling X failed with status 404 Not Found:
    BODY` (`pushing` for a push); the verb's handleClientError message goes before it."""
    try:
        yield from events
    except DaemonError as exc:
        if not exc.status_code:  # nothing answered: the client's own words
            raise
        message = f"{verb} {model} failed with status {status_line(exc.status_code)}: {exc.message}"
        raise type(exc)(exc.status_code, message, exc.request_id) from None


def pull_events(daemon: Client, model: str) -> Iterator[Event]:
    """The daemon's pull of `model` (HF_TOKEN sent for Hugging Face), its refusal in DMR's words."""
    return _answered_in_dmr_words(daemon.pull(model, hf_token(model)), "pulling", model)


def pull_model(daemon: Client, model: str, as_json: bool = False) -> int:
    """pull.go pullModel, for `pull` and `run`'s automatic pull: the progress, then the success message;
    any failure after handleClientError's "Failed to pull model: ", exit code 1. Beyond DMR: a failed
    pull of a name close to a stored model's (a typo: ai/smolm2) asks whether that one was meant."""
    try:
        status = render_transfer(pull_events(daemon, model), as_json, "pull", PULL_FAILURE)
    except DaemonError as exc:
        print(f"{PULL_FAILURE}: {exc.message}", file=sys.stderr)
        status = 1
    if status == 1 and not as_json and (meant := close_local_model(daemon, model)):
        print(f"did you mean {meant}? (it is in the local store)", file=sys.stderr)
    return status


def close_local_model(daemon: Client, model: str) -> str | None:
    """The stored model of the same registry whose name is closest to `model`, if one is close enough to
    be a typo of it (its repository and tag compared, `:latest` left out), named as the user types it
    (`ai/smollm2`: the default registry and `:latest` left out)."""
    import difflib

    from modelrunner.display import DEFAULT_ORG, DEFAULT_TAG, display_name
    from modelrunner.errors import ModelRunnerError
    from modelrunner.reference import parse_reference

    def compared(full: str) -> tuple[str, str]:
        ref = parse_reference(full)
        return ref.registry, str(ref).removeprefix(ref.registry + "/").removesuffix(f":{DEFAULT_TAG}")

    try:
        registry, wanted = compared(model)
        tags = [(compared(tag), tag) for found in daemon.list_models() for tag in found.tags]
        stored = {name: tag for (where, name), tag in tags if where == registry}
    except ModelRunnerError:
        return None  # a name that does not parse, or a runner that does not answer: nothing to offer
    stored.pop(wanted, None)
    close = difflib.get_close_matches(wanted, sorted(stored), n=1, cutoff=0.8)
    if not close:
        return None
    shown = display_name(stored[close[0]])
    return shown if "/" in shown else f"{DEFAULT_ORG}/{shown}"


def hf_token(name: str) -> str | None:
    """DMR's CLI sends HF_TOKEN as the bearer token of Hugging Face pulls."""
    lowered = name.strip().lower()
    if lowered.startswith(("hf.co/", "huggingface.co/")):
        return os.environ.get("HF_TOKEN") or None
    return None


def cmd_pull(args: argparse.Namespace) -> int:
    return pull_model(client(), args.model, args.json)


def _push(model: str, as_json: bool) -> int:
    events = _answered_in_dmr_words(client().push(model), "pushing", model)
    return render_transfer(events, as_json, "push", PUSH_FAILURE)


def cmd_push(args: argparse.Namespace) -> int:
    if args.sign_key is None:
        return _push(args.model, args.json)
    from modelrunner.cli import trust

    key = trust.load_private_key(args.sign_key)  # a wrong password fails before anything moves
    pushed = _push(args.model, args.json)
    if pushed == 0:
        trust.sign_in_registry(args.model, key, client().get_model(args.model).id)
    return pushed


def add_commands(commands: Any) -> None:
    pull = commands.add_parser("pull", help="Pull a model from a registry or Hugging Face (hf.co/...).")
    pull.add_argument(
        "model", nargs="?", help="e.g. ai/smollm2, registry.example:5000/org/model:tag, hf.co/org/repo:Q4_K_M"
    )
    takes(pull, DmrArgs("pull", "MODEL", "model", failure=PULL_FAILURE))
    pull.add_argument("--json", action="store_true", help="print the raw progress events")
    pull.set_defaults(handler=cmd_pull)

    push = commands.add_parser("push", help="Push a model to a registry.")
    push.add_argument(
        "model", nargs="?", help="the model's tag, which names the target, e.g. myorg/mymodel:latest"
    )
    takes(push, DmrArgs("push", "MODEL", "model", failure=PUSH_FAILURE))
    push.add_argument("--json", action="store_true", help="print the raw progress events")
    push.add_argument("--sign-key", help="sign what was pushed with a cosign private key (COSIGN_PASSWORD)")
    push.set_defaults(handler=cmd_push)
