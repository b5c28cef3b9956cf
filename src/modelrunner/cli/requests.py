"""`model requests`: the request recorder's records, or (`-f`) new ones as they come (DMR's `requests`)."""

from __future__ import annotations

import argparse
import sys

from modelrunner.cli.common import UsageError


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser("requests", help="Fetch requests+responses from the model runner")
    parser.add_argument("-f", "--follow", action="store_true", help="Follow requests stream")
    parser.add_argument(
        "--include-existing",
        action="store_true",
        help="Include existing requests when starting to follow (only available with --follow)",
    )
    parser.add_argument("--model", help="Specify the model to filter requests")
    parser.set_defaults(handler=cmd_requests)


def cmd_requests(args: argparse.Namespace) -> None:
    from modelrunner.client import connect
    from modelrunner.wire import SSEDecoder

    if args.include_existing and not args.follow:
        raise UsageError("--include-existing can only be used with --follow")
    chunks = connect().requests(args.model, args.follow, args.include_existing)
    if not args.follow:
        for chunk in chunks:
            sys.stdout.buffer.write(chunk)
        sys.stdout.flush()
        return
    print("Connected to request stream. Press Ctrl+C to stop.", flush=True)
    decoder = SSEDecoder()
    for chunk in chunks:
        for event, data in decoder.feed(chunk):
            if event in ("new_request", "existing_request"):
                print(data.decode("utf-8", "replace"), flush=True)
    print("Stream closed by server.")
