"""A command on a pseudo-terminal, driven as a person types: the interactive chat's tests."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path


class Terminal:
    """A CLI process on a pseudo-terminal, as a person runs the interactive chat: `model ARGS`, or with
    `program` another command line before ARGS (the `docker` client, say)."""

    def __init__(
        self, args: list[str], env: dict[str, str], cwd: Path, program: list[str] | None = None
    ) -> None:
        self.master, slave = pty.openpty()
        program = [sys.executable, "-m", "modelrunner"] if program is None else program
        self.process = subprocess.Popen(
            [*program, *args],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env=env,
            cwd=cwd,
        )
        os.close(slave)
        self.output = ""

    def expect(self, text: str, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        while text not in self.output:
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {text!r} in:\n{self.output}")
            ready, _, _ = select.select([self.master], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(self.master, 65536).decode("utf-8", "replace")
                except OSError:
                    break
                if "\x1b[6n" in chunk:  # prompt_toolkit asks where the cursor is: answer
                    os.write(self.master, b"\x1b[1;1R")
                self.output += chunk
        found = self.output
        self.output = ""
        return found

    def send(self, line: str) -> None:
        os.write(self.master, line.encode() + b"\r")
        time.sleep(0.3)  # let the line editor take each line on its own

    def close(self) -> int:
        try:
            return self.process.wait(30)
        finally:
            os.close(self.master)

    def __enter__(self) -> Terminal:
        return self

    def __exit__(self, *_: object) -> None:
        """A test that failed before `close` leaves no process behind."""
        if self.process.poll() is None:
            self.process.kill()
