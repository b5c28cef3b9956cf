"""The interactive chat of `model run MODEL` (no prompt): history, multi-line input, a few commands."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from modelrunner.client import Client

HELP = """Commands:
  /bye, /exit          leave the chat (Ctrl-D works too)
  /set system <text>   set the system message (and start a new conversation)
  /set num_ctx <n>     set the model's context size (reloads it)
  /clear               forget the conversation so far
  /?                   this help
Start and end a message with three double quotes (\"\"\") to write several lines.
Ctrl-C stops the current answer; the chat goes on."""


def read_message(session: Any) -> str | None:
    """One user message; None at end of input. A message opened with three quotes runs until a line
    ends with three quotes."""
    try:
        line = session.prompt(">>> ")
    except EOFError:
        return None
    if not line.lstrip().startswith('"""'):
        return str(line)
    first = line.lstrip()[3:]
    if first.rstrip().endswith('"""'):
        return str(first.rstrip()[:-3])
    parts = [first]
    while True:
        try:
            more = session.prompt("... ")
        except EOFError:
            break
        if more.rstrip().endswith('"""'):
            parts.append(more.rstrip()[:-3])
            break
        parts.append(more)
    return "\n".join(parts).strip()


def interactive_chat(daemon: Client, model: str, backend: str | None) -> int:
    from prompt_toolkit import PromptSession
    from prompt_toolkit.history import FileHistory

    from modelrunner import config
    from modelrunner.cli.inference import stream_answer
    from modelrunner.errors import DaemonError

    history_file = config.runner_home() / "chat_history"
    history_file.parent.mkdir(parents=True, exist_ok=True)
    session: Any = PromptSession(history=FileHistory(str(history_file)))
    daemon.preload(model, backend)  # load while the user types
    system: str | None = None
    messages: list[dict[str, Any]] = []
    print('Type /? for help, /bye to leave. """ starts a multi-line message.')
    while True:
        try:
            text = read_message(session)
        except KeyboardInterrupt:
            continue
        if text is None or text.strip() in ("/bye", "/exit"):
            return 0
        command = text.strip()
        if not command:
            continue
        if command == "/?":
            print(HELP)
            continue
        if command == "/clear":
            messages = []
            continue
        if command.startswith("/set system "):
            system, messages = command[len("/set system ") :].strip(), []
            continue
        if command.startswith("/set num_ctx "):
            value = command[len("/set num_ctx ") :].strip()
            if not value.lstrip("-").isdigit():
                print("num_ctx must be a number of tokens")
                continue
            try:
                daemon.configure({"model": model, "context-size": int(value)}, backend)
                print(f"Context size set to {value}")
            except DaemonError as exc:
                print(f"Error: {exc.message}")
            continue
        if command.startswith("/"):
            print(f"Unknown command {command.split()[0]}; /? lists them")
            continue
        messages.append({"role": "user", "content": text})
        prefix = [{"role": "system", "content": system}] if system else []
        try:
            answer = stream_answer(daemon, model, prefix + messages, backend)
            messages.append({"role": "assistant", "content": answer})
        except KeyboardInterrupt:
            print()  # the answer is cut; the question stays unanswered in the history
            messages.pop()
        except DaemonError as exc:
            print(f"Error: {exc.message}")
            messages.pop()
