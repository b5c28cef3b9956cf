"""A real daemon process for integration tests: `python -m modelrunner serve` on a free port."""

from __future__ import annotations

import itertools
import json
import os
import resource
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx


def _ephemeral_start() -> int:
    """The first port of the kernel's ephemeral range (Linux: 32768 by default)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


# Ports for the tests' servers are handed out from below the ephemeral range, each once per process: a port
# the kernel found free there (bind to port 0) is one it can give any connecting socket, or another bind to 0,
# before the server it was meant for binds it. Above Ray's worker ports (10002-19999 by default); each process
# starts at an offset of its own, so two runs on one machine seldom meet.
_EPHEMERAL_START = _ephemeral_start()
_next_ports = itertools.count(20000 + os.getpid() % 4000)


def free_port() -> int:
    """A loopback port nothing listens on, for a server a test starts."""
    for port in _next_ports:
        if port >= _EPHEMERAL_START:
            break  # none left below the ephemeral range: the kernel's choice, as a last resort
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue  # taken by someone else, or still closing
            return port
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def runner_env(home: Path, port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("MODELS_PATH", "MODEL_RUNNER_HOST")}
    env.update({"MODEL_RUNNER_HOME": str(home), "MODEL_RUNNER_PORT": str(port)})
    # never the user's Docker config (its model contexts would redirect the CLI); a test may name its own
    env.setdefault("DOCKER_CONFIG", str(home / "docker-config"))
    return env


def snapshot(root: Path) -> dict[str, int]:
    """Every file under root with its size: what "the store is unchanged" is checked against."""
    return {
        str(p.relative_to(root)): p.stat().st_size
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.name.endswith(".lock")
    }


def engine_log(home: Path, engine: str) -> str:
    """What the engine's runners of a daemon wrote: `logs/engine-<engine>-<model>-<mode>.log`, all models."""
    return "".join(path.read_text() for path in sorted((home / "logs").glob(f"engine-{engine}-*.log")))


@dataclass
class Daemon:
    home: Path
    port: int
    process: subprocess.Popen[bytes] | None = None
    nofile: tuple[int, int] | None = None  # the daemon's RLIMIT_NOFILE (soft, hard) as it starts
    log: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log = self.home / "test-daemon.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        return runner_env(self.home, self.port)

    def cli_env(self, pycache: Path) -> dict[str, str]:
        """`env` for timed CLI runs (bench/): bytecode cached under `pycache`, as an installed package has
        it; the tests' PYTHONDONTWRITEBYTECODE would make every run compile the CLI's modules again."""
        env = {k: v for k, v in self.env.items() if k != "PYTHONDONTWRITEBYTECODE"}
        return {**env, "PYTHONPYCACHEPREFIX": str(pycache)}

    @property
    def store_root(self) -> Path:
        return self.home / "models"

    def start(self) -> Daemon:
        self.home.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "modelrunner", "serve"],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=self._limits if self.nofile else None,
            )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/version", timeout=1).status_code in (200, 401):  # 401: needs a key
                    return self
            except httpx.TransportError:
                pass
            if self.process.poll() is not None:
                raise RuntimeError("daemon exited at start:\n" + self.log.read_text())
            time.sleep(0.05)
        self.stop()  # a daemon that never answered is not left running
        raise RuntimeError("daemon did not start:\n" + self.log.read_text())

    def _limits(self) -> None:
        assert self.nofile is not None
        resource.setrlimit(resource.RLIMIT_NOFILE, self.nofile)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def http(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        kwargs.setdefault("timeout", 60)
        return httpx.request(method, self.url + path, **kwargs)

    def cli(
        self, *args: str, check: bool = True, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [sys.executable, "-m", "modelrunner", *args],
            env=self.env,
            capture_output=True,
            text=True,
            input=stdin,
            timeout=120,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"model {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
        return result

    def models(self) -> list[dict[str, Any]]:
        response = self.http("GET", "/models")
        response.raise_for_status()
        result: list[dict[str, Any]] = response.json()
        return result


class Daemons:
    """Starts daemon processes, each stopped at the end (the fixture `daemons`): for a test that sets the
    daemon's environment first (monkeypatch) or starts more than one."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.running: list[Daemon] = []

    def start(self, home: Path | None = None) -> Daemon:
        """A daemon under `home` (default `tmp_path/home`) with the environment as it is now."""
        daemon = Daemon(home or self.tmp_path / "home", free_port())
        self.running.append(daemon)
        return daemon.start()

    def stop_all(self) -> None:
        for daemon in self.running:
            daemon.stop()


def error_message(response: httpx.Response) -> str:
    """The message of an error: DMR's routes answer http.Error's text (the message and a newline), the
    other APIs' and the middleware's refusals their JSON."""
    if response.headers.get("content-type") == "text/plain; charset=utf-8":
        assert response.text.endswith("\n") and response.text.strip(), response.text
        return response.text[:-1]
    body = response.json()
    assert set(body) == {"error"}, body
    message = body["error"]["message"]
    assert isinstance(message, str) and message
    assert body["error"]["code"] == response.status_code
    return message


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def parse_logfmt(line: str) -> dict[str, str]:
    """The fields of a daemon.log event line (logfmt: key=value, quoted values unquoted)."""
    fields: dict[str, str] = {}
    rest = line.split(" ", 3)[-1]
    while rest:
        key, _, rest = rest.partition("=")
        if rest.startswith('"'):
            end = 1
            while rest[end] != '"':
                end += 2 if rest[end] == "\\" else 1
            fields[key] = json.loads(rest[: end + 1])
            rest = rest[end + 1 :].lstrip()
        else:
            value, _, rest = rest.partition(" ")
            fields[key] = value
    return fields
