"""`model worker`: run llama.cpp's RPC worker on this machine, for a model runner elsewhere to use.

Like `model serve`, this runs a local process rather than calling the daemon: the worker is llama.cpp's own
`ggml-rpc-server` (installed with the llama.cpp engine), run as this command's child until it ends (Ctrl-C
stops both; a `kill -9` of this command ends the worker too), so that a worker that dies by a signal is
said in words (engines/exit_reason.py: SIGILL, a build this CPU cannot run; SIGKILL, most often the
out-of-memory killer). On the machine that loads the model: `model configure --rpc THIS_HOST:PORT MODEL`.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from modelrunner.cli.common import UsageError

# ggml-rpc-server's own default, as engines/rpc_workers.DEFAULT_PORT (a test keeps them equal): written here
# so that registering the verb does not import the engine modules
DEFAULT_PORT = 50052


def cmd_worker(args: argparse.Namespace) -> None:
    from modelrunner.config import is_loopback_host
    from modelrunner.engines import rpc_workers
    from modelrunner.engines.llamacpp import LlamaCppEngine

    if not 0 < args.port < 65536:
        raise UsageError("--port must be from 1 to 65535")
    if args.mem is not None and args.mem < 1:
        raise UsageError("--mem must be a number of MiB")
    if args.threads is not None and args.threads < 1:
        raise UsageError("--threads must be at least 1")
    found = LlamaCppEngine().find()
    binary = rpc_workers.find_worker_binary(found.path if found else None)
    argv = rpc_workers.worker_command(binary, args.host, args.port, args.threads, args.cache)
    if not is_loopback_host(args.host):
        print(
            f"WARNING: the RPC worker listens on {args.host}:{args.port}, beyond this machine. llama.cpp's "
            "RPC has no authentication and no encryption: anyone who reaches this port can use this "
            "machine's memory and compute. Allow only the model runner's machine to reach it (a firewall, "
            "a private network).",
            file=sys.stderr,
        )
    limit = None
    if args.mem is not None:
        limit = rpc_workers.data_limit(args.mem, args.threads or os.cpu_count() or 1)
    where = f"{args.host}:{args.port}"
    cap = f", at most {args.mem} MiB of model buffers" if args.mem is not None else ""
    print(f"Starting the llama.cpp RPC worker on {where}{cap}; stop it with Ctrl-C", file=sys.stderr)
    print(f"Use it from the model runner's machine: model configure --rpc {where} MODEL", file=sys.stderr)
    sys.stderr.flush()
    sys.exit(run_worker(argv, limit))


def run_worker(argv: list[str], data_limit: int | None) -> int:
    """Run the worker until it ends: its exit status (128 + the signal that ended it); a signal this command
    did not pass on is said in words first."""
    import resource
    import signal
    import subprocess

    from modelrunner.child_process import end_with_parent
    from modelrunner.engines import exit_reason
    from modelrunner.engines.llamacpp import NAME

    ends_with_us = end_with_parent(os.getpid())

    def before_exec() -> None:
        ends_with_us()
        if data_limit is not None:  # the worker's model buffers, not this command's
            resource.setrlimit(resource.RLIMIT_DATA, (data_limit, data_limit))

    worker = subprocess.Popen(argv, preexec_fn=before_exec)
    passed_on: list[int] = []

    def pass_on(signum: int, _frame: object) -> None:
        passed_on.append(signum)
        worker.send_signal(signum)

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, pass_on)
    code = worker.wait()
    if code >= 0:
        return code
    if not passed_on:
        words = exit_reason.describe_exit(code, engine=NAME)
        print(f"Error: the RPC worker stopped: {words}", file=sys.stderr)
    return 128 - code


def add_commands(commands: Any) -> None:
    worker = commands.add_parser(
        "worker",
        help="Run a llama.cpp RPC worker here, to hold part of a model loaded on another machine.",
        description="Run llama.cpp's RPC worker (ggml-rpc-server) in the foreground. It has no "
        "authentication: it listens on 127.0.0.1 unless --host says otherwise.",
    )
    worker.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; others: no auth!)"
    )
    worker.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    worker.add_argument(
        "--mem",
        type=int,
        metavar="MiB",
        help="the most memory the worker may allocate for model buffers (a hard limit; loads beyond it fail)",
    )
    worker.add_argument("--threads", type=int, metavar="N", help="CPU threads (default: llama.cpp's)")
    worker.add_argument(
        "--cache", action="store_true", help="cache received tensors on disk (faster reloads of a model)"
    )
    worker.set_defaults(handler=cmd_worker)
