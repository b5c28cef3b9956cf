"""`model worker`: run llama.cpp's RPC worker on this machine, for a model runner elsewhere to use.

Like `model serve`, this runs a local process rather than calling the daemon: the worker is llama.cpp's own
`ggml-rpc-server` (installed with the llama.cpp engine), which replaces this process (Ctrl-C stops it).
On the machine that loads the model: `model configure --rpc THIS_HOST:PORT MODEL`.
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
    if args.mem is not None:
        import resource

        threads = args.threads or os.cpu_count() or 1
        limit = rpc_workers.data_limit(args.mem, threads)
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))  # inherited by the worker
    where = f"{args.host}:{args.port}"
    cap = f", at most {args.mem} MiB of model buffers" if args.mem is not None else ""
    print(f"Starting the llama.cpp RPC worker on {where}{cap}; stop it with Ctrl-C", file=sys.stderr)
    print(f"Use it from the model runner's machine: model configure --rpc {where} MODEL", file=sys.stderr)
    sys.stderr.flush()
    os.execv(argv[0], argv)


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
