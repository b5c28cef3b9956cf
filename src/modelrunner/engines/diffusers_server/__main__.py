"""`python -m modelrunner.engines.diffusers_server --model-path X.dduf --uds SOCKET --served-model-name NAME`.

Serves the socket at once and loads in the background (`/health` is 503 until the pipeline is ready). A
failure to unpack or load prints `DIFFUSERS_ERROR: <cause>` (DMR's marker) and exits with status 1.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import traceback
from pathlib import Path

from .app import ServerState, build_app
from .dduf import BadDDUF, unpack

UNPACKED_DIR = "dduf-unpacked"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m modelrunner.engines.diffusers_server")
    parser.add_argument("--model-path", required=True, type=Path, help="the model's .dduf file")
    parser.add_argument("--uds", required=True, type=Path, help="Unix socket to listen on")
    parser.add_argument("--served-model-name", required=True, nargs="+", help="names the model answers to")
    parser.add_argument(
        "--unpack-dir",
        type=Path,
        help=f"where the DDUF is unpacked (default: {UNPACKED_DIR}/ beside the model's folder)",
    )
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    return parser.parse_args(argv)


def fail(cause: str) -> None:
    print(f"DIFFUSERS_ERROR: {cause}", file=sys.stderr, flush=True)


def load(args: argparse.Namespace, state: ServerState, stop: threading.Event) -> None:
    try:
        unpack_dir = args.unpack_dir or args.model_path.resolve().parent.parent / UNPACKED_DIR
        folder = unpack(args.model_path, unpack_dir)
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is local: never ask a hub for files
        from .pipeline import ImagePipeline  # torch loads here, after the socket is up

        state.pipeline = ImagePipeline(folder, args.device)
        print(f"diffusers server: pipeline loaded on {state.pipeline.device}", flush=True)
    except BadDDUF as exc:
        fail(f"invalid DDUF file {args.model_path.name}: {exc}")
        stop.set()
    except Exception as exc:
        traceback.print_exc()
        fail(f"{exc.__class__.__name__}: {str(exc).splitlines()[0] if str(exc) else 'no details'}")
        stop.set()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.model_path.is_file():
        fail(f"model file {args.model_path.name} not found")
        return 1
    import uvicorn

    state = ServerState(served_names=tuple(args.served_model_name))
    failed = threading.Event()
    args.uds.unlink(missing_ok=True)
    server = uvicorn.Server(uvicorn.Config(build_app(state), uds=str(args.uds), log_level="warning"))

    def watch() -> None:
        failed.wait()
        server.should_exit = True

    threading.Thread(target=load, args=(args, state, failed), name="load", daemon=True).start()
    threading.Thread(target=watch, name="watch", daemon=True).start()
    server.run()
    return 1 if failed.is_set() else 0


if __name__ == "__main__":
    sys.exit(main())
