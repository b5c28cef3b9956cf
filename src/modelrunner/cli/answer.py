"""A chat answer printed as it streams, for `model run PROMPT` and each turn of the interactive chat."""

from __future__ import annotations

import sys
import threading
from typing import TYPE_CHECKING, Any

from modelrunner.cli.common import display
from modelrunner.wire import document_message

if TYPE_CHECKING:
    from collections.abc import Callable

    from modelrunner.client import Client

ITALIC, RESET = "\x1b[3m", "\x1b[0m"

LOADING_NOTICE_AFTER = 2.0  # seconds without a first token before saying why

# Said on stderr when the engine stopped the answer at its token limit: the text looks finished otherwise
CUT_NOTICE = (
    'The answer was cut short: it reached the token limit (finish_reason "length"); '
    "a larger --max-tokens or context size (model configure --context-size) lets it finish."
)


def _say_if_loading(daemon: Client, model: str) -> None:
    """A long engine start (vLLM takes ~30 s on a CPU) is reported, so it is not mistaken for a hang."""
    from modelrunner.errors import DaemonError

    try:
        runners = daemon.ps()
    except DaemonError:
        return
    for runner in runners:
        if runner.loading and model in (runner.model_name, display(runner.model_name)):
            print(f"Loading the model in {runner.backend_name}...", file=sys.stderr, flush=True)
            return


def loading_notice(daemon: Client, model: str) -> threading.Timer:
    """A started timer that says, on stderr, when the model is still loading LOADING_NOTICE_AFTER seconds
    from now; cancel it once the first answer comes."""
    notice = threading.Timer(LOADING_NOTICE_AFTER, _say_if_loading, (daemon, model))
    notice.daemon = True
    notice.start()
    return notice


def stream_answer(
    daemon: Client,
    model: str,
    messages: list[dict[str, Any]],
    backend: str | None,
    color: bool = False,
    on_event: Callable[[dict[str, Any]], None] | None = None,
    **options: Any,
) -> str:
    """Print an answer as it streams; returns its text. Reasoning comes first under "Thinking:" (italic
    with --color), as DMR prints it. An error event or a cut stream raises DaemonError. `on_event` sees
    each event too (the web search tool loop collects tool calls with it)."""
    from modelrunner.errors import DaemonError

    text: list[str] = []
    finish_reason = None
    state = "none"  # none | reasoning | content
    notice = loading_notice(daemon, model)
    try:
        for event in daemon.chat_stream(model, messages, backend, **options):
            notice.cancel()
            if "error" in event or event.get("type") == "error":
                raise DaemonError(500, document_message(event) or str(event.get("error", event)))
            if on_event is not None:
                on_event(event)
            for choice in (event.get("choices") or [])[:1]:
                finish_reason = choice.get("finish_reason") or finish_reason
                delta = choice.get("delta") or choice.get("message") or {}
                reasoning = delta.get("reasoning_content")
                if reasoning:
                    if state == "content":
                        sys.stdout.write("\n\n")
                    if state != "reasoning":
                        sys.stdout.write((ITALIC if color else "") + "Thinking:\n")
                    state = "reasoning"
                    sys.stdout.write(reasoning)
                content = delta.get("content")
                if content:
                    if state == "reasoning":
                        sys.stdout.write((RESET if color else "") + "\n\n--\n\n")
                    state = "content"
                    sys.stdout.write(content)
                    text.append(content)
                sys.stdout.flush()
    finally:
        notice.cancel()
        if state == "reasoning" and color:
            sys.stdout.write(RESET)
        sys.stdout.flush()
    if finish_reason == "length":
        # on its own line when both streams share a terminal; stdout keeps the answer's bytes
        print(("\n" if sys.stdout.isatty() else "") + CUT_NOTICE, file=sys.stderr, flush=True)
    return "".join(text)
