"""`model gateway`: an OpenAI-compatible gateway that routes model aliases to configured providers (DMR's
`cmd/cli/commands/gateway.go`; the server is modelrunner/gateway.py, on LiteLLM, an optional extra)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _port(text: str) -> int:
    """A uint16, as DMR's flag."""
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f'invalid argument "{text}" for "-p, --port" flag')
    return port


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "gateway",
        help="Run an OpenAI-compatible LLM gateway",
        description="Run an OpenAI-compatible LLM gateway that routes requests to configured providers. "
        "Supported providers include Docker Model Runner, Ollama, OpenAI, Anthropic, "
        "Groq, Mistral, Azure OpenAI, and many more OpenAI-compatible endpoints.",
    )
    parser.add_argument("-c", "--config", required=True, help="Path to the YAML configuration file")
    parser.add_argument("--host", default="0.0.0.0", help="Host address to bind to")
    parser.add_argument("-p", "--port", type=_port, default=4000, help="Port to listen on")
    parser.add_argument("-v", "--verbose", action="store_true", help="Enable verbose (debug) logging")
    parser.set_defaults(handler=cmd_gateway)


def cmd_gateway(args: argparse.Namespace) -> int:
    import uvicorn

    from modelrunner.config import client_target
    from modelrunner.gateway import ConfigError, MissingLibrary, build_router, create_app, load_config

    target = client_target()
    try:
        config = load_config(Path(args.config), (target.base_url + "/engines/v1", target.api_key))
    except ConfigError as exc:
        print(f"Failed to load config: {exc}", file=sys.stderr)
        return 1
    try:
        router = build_router(config, args.verbose)
    except MissingLibrary as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    print(f"Loaded {len(config.deployments)} model deployment(s): {config.aliases}", file=sys.stderr)
    if config.master_key is None:
        print("No master_key configured — API is open to all requests", file=sys.stderr)
    print(f"gateway listening on {args.host}:{args.port}", file=sys.stderr, flush=True)
    level = "debug" if args.verbose else "info"
    uvicorn.run(create_app(config, router), host=args.host, port=args.port, log_level=level)
    return 0
