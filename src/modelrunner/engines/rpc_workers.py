"""llama.cpp across machines: RPC workers (`ggml-rpc-server`) that hold part of a model's layers.

`llama-server --rpc HOST:PORT,...` treats each worker as one more device and spreads the layers it offloads
(`-ngl`) over them, in proportion to the memory each reports; the process on this machine keeps the token
embeddings and whatever is not offloaded. A worker is llama.cpp's own `ggml-rpc-server` (tools/rpc/,
built beside llama-server with `-DGGML_RPC=ON`): `model worker` runs one.

What the pinned worker does and does not do, which shapes this module:
* no authentication and no encryption: anyone who reaches its port can run code on its memory. So
  `model worker` binds 127.0.0.1 unless told otherwise, and warns when told.
* one client at a time: it accepts a connection, serves it until it closes, then accepts the next. A worker
  serves one loaded model; a second model (or a probe) waits until the first unloads.
* no memory option (older builds had `--mem`): it reports the machine's whole RAM (or the GPU's memory).
  `model worker --mem` is therefore a hard cap on the worker's allocations (RLIMIT_DATA), not a number it
  advertises; an uneven split is set on the loading side with `--tensor-split`.
* a worker that goes away mid-request makes llama-server abort ("Remote RPC server crashed"): the request
  gets an error, the runner is gone, and the next request loads again (and finds the worker, or names it).

Before a load, `check_workers` speaks the protocol's first message (HELLO) to every worker, so that one
that is down, busy or of another llama.cpp version is a clear 503 naming it, not an engine that dies.
"""

from __future__ import annotations

import ipaddress
import re
import shutil
import socket
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from modelrunner.engines.llamacpp_binary import RPC_EXECUTABLE
from modelrunner.errors import BadRequest, EngineNotInstalled, EngineUnavailable

DEFAULT_PORT = 50052  # rpc-server's own default
MAX_WORKERS = 16
PROBE_TIMEOUT = 5.0  # seconds for a worker to accept and answer HELLO
# The protocol of the pinned llama.cpp (ggml/include/ggml-rpc.h: RPC_PROTO_MAJOR_VERSION 7). A worker must
# speak the same major version and no newer minor one, as llama-server checks.
PROTO_MAJOR = 7
PROTO_MINOR = 0
_CMD_GET_DEVICE_MEMORY = 11
_CMD_HELLO = 14
_CMD_DEVICE_COUNT = 15
_CONN_CAPS = 24  # bytes of transport capabilities in HELLO (all zero: plain TCP)
_HOSTNAME = re.compile(r"(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9-]{1,63})*")
_U64 = struct.Struct("<Q")


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class WorkerInfo:
    endpoint: Endpoint
    protocol: str  # "7.0.0"
    devices: tuple[tuple[int, int], ...]  # (free, total) bytes per device the worker exposes


def parse_endpoint(text: str) -> Endpoint:
    """`HOST:PORT` as llama.cpp parses it (the host up to the first colon, so no IPv6 literals)."""
    host, sep, port_text = text.strip().partition(":")
    if not sep or not host or not port_text:
        raise BadRequest(f"RPC worker {text[:80]!r} must be HOST:PORT, e.g. 192.168.1.20:{DEFAULT_PORT}")
    if ":" in port_text or host.startswith("["):
        raise BadRequest(f"RPC worker {text[:80]!r}: IPv6 addresses are not supported by llama.cpp's RPC")
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise BadRequest(f"RPC worker {text[:80]!r}: the port must be a number from 1 to 65535")
    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        if not _HOSTNAME.fullmatch(host):
            raise BadRequest(f"RPC worker {text[:80]!r}: not a host name or IPv4 address") from None
    return Endpoint(host, int(port_text))


def parse_workers(value: object) -> list[str]:
    """The `rpc` setting: a list of HOST:PORT (or one comma-separated string), normalised; [] turns it off."""
    if isinstance(value, str):
        items: list[object] = [part for part in value.split(",") if part.strip()]
    elif isinstance(value, list):
        items = value
    else:
        raise BadRequest("rpc must be a list of HOST:PORT workers (or one string, comma-separated)")
    if len(items) > MAX_WORKERS:
        raise BadRequest(f"at most {MAX_WORKERS} RPC workers")
    workers: list[str] = []
    for item in items:
        if not isinstance(item, str):
            raise BadRequest("rpc must be a list of HOST:PORT strings")
        endpoint = str(parse_endpoint(item))
        if endpoint in workers:
            raise BadRequest(f"RPC worker {endpoint} is listed twice")
        workers.append(endpoint)
    return workers


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the worker closed the connection")
        data += chunk
    return bytes(data)


def _command(sock: socket.socket, cmd: int, payload: bytes, answer_size: int) -> bytes:
    """One request/answer of the RPC protocol: cmd byte, u64 size, payload; then u64 size, answer."""
    sock.sendall(bytes([cmd]) + _U64.pack(len(payload)) + payload)
    (size,) = _U64.unpack(_recv_exact(sock, _U64.size))
    if size != answer_size:
        raise ConnectionError(f"unexpected answer size {size} (expected {answer_size})")
    return _recv_exact(sock, answer_size)


def probe(endpoint: Endpoint, timeout: float = PROBE_TIMEOUT) -> WorkerInfo:
    """Say HELLO to a worker and ask it its devices; EngineUnavailable (503) naming it when it cannot."""
    try:
        sock = socket.create_connection((endpoint.host, endpoint.port), timeout=timeout)
    except TimeoutError:
        raise EngineUnavailable(
            f"the RPC worker {endpoint} does not answer (no connection within {timeout:.0f} s): "
            "check that the machine is up and the port is open"
        ) from None
    except OSError as exc:
        reason = exc.strerror or exc.__class__.__name__
        raise EngineUnavailable(
            f"the RPC worker {endpoint} does not answer ({reason.lower()}): "
            f"start it on that machine with `model worker --port {endpoint.port}`"
        ) from None
    with sock:
        try:
            hello = _command(sock, _CMD_HELLO, bytes(_CONN_CAPS), 4 + _CONN_CAPS)
            major, minor, patch = hello[0], hello[1], hello[2]
            if major != PROTO_MAJOR or minor > PROTO_MINOR:
                raise EngineUnavailable(
                    f"the RPC worker {endpoint} speaks RPC protocol {major}.{minor}.{patch}, and this "
                    f"llama.cpp speaks {PROTO_MAJOR}.{PROTO_MINOR}: run the same llama.cpp build on both "
                    "(model install-runner --backend llama.cpp)"
                )
            (count,) = struct.unpack("<I", _command(sock, _CMD_DEVICE_COUNT, b"", 4))
            devices = []
            for device in range(min(count, 64)):
                answer = _command(sock, _CMD_GET_DEVICE_MEMORY, struct.pack("<I", device), 16)
                free, total = struct.unpack("<QQ", answer)
                devices.append((free, total))
        except TimeoutError:
            raise EngineUnavailable(
                f"the RPC worker {endpoint} accepted the connection but did not answer within "
                f"{timeout:.0f} s: a worker serves one model at a time; is another model using it?"
            ) from None
        except (OSError, ConnectionError) as exc:
            raise EngineUnavailable(
                f"the RPC worker {endpoint} did not answer as an RPC worker ({exc}): is it a "
                "`model worker` (llama.cpp's ggml-rpc-server)?"
            ) from None
    return WorkerInfo(endpoint, f"{major}.{minor}.{patch}", tuple(devices))


def check_workers(workers: Sequence[str], timeout: float = PROBE_TIMEOUT) -> list[WorkerInfo]:
    """Probe every worker before a load: the first that fails raises EngineUnavailable naming it."""
    return [probe(parse_endpoint(worker), timeout) for worker in workers]


def wait_until_listening(endpoint: Endpoint, timeout: float) -> bool:
    """Whether a TCP port accepts connections within timeout (a new worker starts in a moment)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((endpoint.host, endpoint.port), timeout=1):
                return True
        except OSError:
            time.sleep(0.05)
    return False


def find_worker_binary(server: Path | None) -> Path:
    """`ggml-rpc-server` beside the llama-server in use (same build, same protocol), else on PATH."""
    names = (RPC_EXECUTABLE, "rpc-server")  # `rpc-server` is the name of older builds
    if server is not None:
        for name in names:
            candidate = server.parent / name
            if candidate.is_file():
                return candidate
    for name in names:
        found = shutil.which(name)
        if found:
            return Path(found)
    raise EngineNotInstalled(
        "llama.cpp's RPC worker (ggml-rpc-server) is not installed; run: model install-runner --backend "
        "llama.cpp (it is built with llama-server)"
    )


def worker_command(binary: Path, host: str, port: int, threads: int | None, cache: bool) -> list[str]:
    argv = [str(binary), "--host", host, "--port", str(port)]
    if threads is not None:
        argv += ["--threads", str(threads)]
    if cache:
        argv.append("--cache")  # keeps received tensors on disk: a reload of the same model sends less
    return argv


# A worker's own memory beyond the model's buffers: code, the backend's state and one stack per thread
# (private writable mappings count against RLIMIT_DATA).
WORKER_OVERHEAD_BYTES = 256 * 1024 * 1024
THREAD_STACK_BYTES = 8 * 1024 * 1024


def data_limit(mem_mib: int, threads: int) -> int:
    """RLIMIT_DATA for a worker that may hold `mem_mib` MiB of model buffers."""
    return mem_mib * 1024 * 1024 + WORKER_OVERHEAD_BYTES + threads * THREAD_STACK_BYTES
