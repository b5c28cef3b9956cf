"""The interactive chat of `model run MODEL` (no prompt), with DMR's commands and input forms
(`cmd/cli/commands/run.go`): `\"\"\"` or `'''` multi-line messages, `/bye` `/exit`, `/?` `/help` (and
`/? shortcuts|files|set`), `/set system`, `/set num_ctx`, `/set parameter num_ctx`, `@file` inclusion and
image paths as attachments. An error (a failed request, an engine that died mid-answer) is printed and the
chat goes on; Ctrl-C stops the current answer.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from modelrunner.client import Client

USAGE = """Available Commands:
  /bye            Exit
  /set            Set a session variable
  /?, /help       Help for a command
  /? shortcuts    Help for keyboard shortcuts
  /? files        Help for file inclusion with @ symbol
  /? set          Help for /set command

Use \"\"\" to begin a multi-line message.

File Inclusion:
  Type @ followed by a filename to include its content in your prompt
  Examples: @README.md, @./src/main.go, @/path/to/file.txt
"""

USAGE_SHORTCUTS = """Available keyboard shortcuts:
  Ctrl + a            Move to the beginning of the line (Home)
  Ctrl + e            Move to the end of the line (End)
   Alt + b            Move back (left) one word
   Alt + f            Move forward (right) one word
  Ctrl + k            Delete the sentence after the cursor
  Ctrl + u            Delete the sentence before the cursor
  Ctrl + w            Delete the word before the cursor

  Ctrl + l            Clear the screen
  Ctrl + c            Stop the model from responding
  Ctrl + d            Exit (/bye)
"""

USAGE_FILES = """File Inclusion with @ symbol:
  Type @ followed by a filename to include its content in your prompt

  Examples:
    @README.md          Include content of README.md from current directory
    @./src/main.go     Include content of main.go from ./src/ directory
    @/full/path/file   Include content of file using absolute path
    @"file with spaces.txt" Include content of file with spaces in name

  The file content will be embedded in your prompt when you press Enter.
"""

USAGE_SET = """Available /set commands:
  /set system <message>       Set system message for the conversation
  /set num_ctx <n>            Set context window size (in tokens)
  /set parameter num_ctx <n>  Set context window size (in tokens) [deprecated]
"""

QUOTES = ('"""', "'''")

# run.go's readline prompt: the grey hint on an empty input line, and the one inside a multi-line message
PLACEHOLDER = "Send a message (/? for help)"
ALT_PLACEHOLDER = 'Use """ to end multi-line input'


def _hint(text: str) -> Any:
    """A placeholder as prompt_toolkit draws it: dimmed, gone at the first key."""
    from prompt_toolkit.formatted_text import FormattedText

    return FormattedText([("fg:ansibrightblack", text)])


def read_message(session: Any) -> str | None:
    """One user message; None at end of input. A line opening with three quotes (either kind) starts a
    message that runs until the same three quotes end a line."""
    try:
        line = str(session.prompt("> ", placeholder=_hint(PLACEHOLDER)))
    except EOFError:
        return None
    opener = next((q for q in QUOTES if line.startswith(q)), None)
    if opener is None:
        return line
    first = line[3:]
    if first.endswith(opener):
        return first[: -len(opener)]
    parts = [first]
    while True:
        try:
            more = str(session.prompt(". ", placeholder=_hint(ALT_PLACEHOLDER)))
        except EOFError:
            break
        if more.endswith(opener):
            parts.append(more[: -len(opener)])
            break
        parts.append(more)
    return "\n".join(parts)


class Chat:
    """One conversation: its messages, system prompt and the commands that change them."""

    def __init__(
        self, daemon: Client, model: str, backend: str | None, color: bool, websearch: bool = False
    ) -> None:
        self.daemon = daemon
        self.websearch = websearch
        self.model = model
        self.backend = backend
        self.color = color
        self.system = ""
        self.history: list[dict[str, Any]] = []

    def command(self, line: str) -> bool:
        """Run a /command; False when the chat should end."""
        words = line.split()
        name = words[0]
        if name in ("/bye", "/exit"):
            return False
        if name in ("/help", "/?"):
            topic = words[1] if len(words) > 1 else ""
            usage = {"shortcut": USAGE_SHORTCUTS, "shortcuts": USAGE_SHORTCUTS, "file": USAGE_FILES}
            usage |= {"files": USAGE_FILES, "set": USAGE_SET}
            sys.stderr.write(usage.get(topic, USAGE) + "\n")
        elif name == "/set":
            self._set(words[1:], line)
        else:
            print(f"Unknown command '{name}'. Type /? for help")
        return True

    def _set(self, words: list[str], line: str) -> None:
        if not words:
            sys.stderr.write(USAGE_SET + "\n")
        elif words[0] == "system":
            self.system = " ".join(words[1:])
            print("Set system message." if self.system else "Cleared system message.", file=sys.stderr)
        elif words[0] == "num_ctx":
            if len(words) < 2:
                print("Usage: /set num_ctx <value>", file=sys.stderr)
            else:
                self._num_ctx(words[1])
        elif words[0] == "parameter":
            if len(words) < 3:
                print("Usage: /set parameter <name> <value>", file=sys.stderr)
                print("Available parameters: num_ctx", file=sys.stderr)
            elif words[1] != "num_ctx":
                print(f"Unknown parameter: {words[1]}", file=sys.stderr)
                print("Available parameters: num_ctx", file=sys.stderr)
            else:
                self._num_ctx(words[2])
        else:
            print(f"Unknown /set option: {words[0]}", file=sys.stderr)
            sys.stderr.write(USAGE_SET + "\n")

    def _num_ctx(self, value: str) -> None:
        from modelrunner.errors import DaemonError

        if not value.isdigit() or not 0 < int(value) < 2**31:
            print(f"Invalid value for num_ctx: {value} (must be a positive integer)", file=sys.stderr)
            return
        try:
            self.daemon.configure({"model": self.model, "context-size": int(value)}, self.backend)
            print(f"Set num_ctx to {int(value)}", file=sys.stderr)
        except DaemonError as exc:
            print(f"Failed to set num_ctx: {exc.message}", file=sys.stderr)

    def ask(self, text: str) -> None:
        """Send one message and print the answer; an error is printed and the conversation kept as it
        was (the failed turn is not added)."""
        from modelrunner.cli.prompt_files import PromptFileError, user_message
        from modelrunner.cli.websearch import answerer
        from modelrunner.errors import DaemonError

        try:
            message = user_message(text)
        except PromptFileError as exc:
            print(f"Failed to generate a response: {exc}", file=sys.stderr)
            return
        prefix = [{"role": "system", "content": self.system}] if self.system else []
        try:
            messages = [*prefix, *self.history, message]
            answer = answerer(self.websearch)(self.daemon, self.model, messages, self.backend, self.color)
        except KeyboardInterrupt:
            print()  # the answer is cut; the question stays unanswered
            return
        except DaemonError as exc:
            print(f"\nFailed to generate a response: {exc.message}", file=sys.stderr)
            return
        print()
        self.history += [message, {"role": "assistant", "content": answer}]


def interactive_chat(
    daemon: Client,
    model: str,
    backend: str | None,
    color: bool = False,
    preload: bool = True,
    websearch: bool = False,
) -> int:
    from prompt_toolkit import PromptSession
    from prompt_toolkit.history import FileHistory, InMemoryHistory

    from modelrunner import config
    from modelrunner.cli.engines import with_engine_installed
    from modelrunner.errors import DaemonError

    if os.environ.get("DOCKER_MODEL_NOHISTORY"):
        history: Any = InMemoryHistory()
    else:
        history_file = config.runner_home() / "chat_history"
        history_file.parent.mkdir(parents=True, exist_ok=True)
        history = FileHistory(str(history_file))
    session: Any = PromptSession(history=history)
    if preload:
        try:
            with_engine_installed(daemon, lambda: daemon.preload(model, backend))  # the first use installs
        except DaemonError as exc:
            print(f"background model preload failed: {exc.message}", file=sys.stderr)
    chat = Chat(daemon, model, backend, color, websearch)
    while True:
        try:
            text = read_message(session)
        except KeyboardInterrupt:
            print("\nUse Ctrl + d or /bye to exit.")
            continue
        if text is None:
            print()
            return 0
        if not text.strip():
            continue
        if text.startswith("/"):
            if not chat.command(text.strip()):
                return 0
            continue
        chat.ask(text)
