"""`model search`: models on Docker Hub's ai/ namespace and Hugging Face (DMR's commands/search.go)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from modelrunner.cli.common import DmrArgs, UsageError, takes

_DESCRIPTION = (
    "Search for models from Docker Hub (ai/ namespace) and HuggingFace. With no search term, lists the "
    "available models; with one, filters them by name or description."
)


class _AtMostOneTerm(DmrArgs):
    """cobra.MaximumNArgs(1)."""

    def count_error(self, prog: str, count: int) -> str | None:
        return None if count <= 1 else f"accepts at most 1 arg(s), received {count}"


def format_count(n: int) -> str:
    """formatCount: 1.2M, 45.6K, 999."""
    if n >= 1_000_000:
        return f"{n / 1_000_000:.1f}M"
    if n >= 1_000:
        return f"{n / 1_000:.1f}K"
    return str(n)


def cmd_search(args: argparse.Namespace) -> None:
    from modelrunner.artifact.gojson import go_quote
    from modelrunner.artifact.units import format_size
    from modelrunner.cli.dmrformat import go_table, standard_json
    from modelrunner.distribution import search as hub

    sources = hub.SOURCES.get(args.source)
    if sources is None:
        raise UsageError(hub.unknown_source(args.source))
    query = args.term[0] if args.term else ""
    try:
        results = hub.search(sources, query, args.limit, lambda line: print(line, file=sys.stderr))
    except hub.SearchError as exc:
        raise UsageError(f"search failed: {exc}") from None
    if not results:
        print(f"No models found matching {go_quote(query)}" if query else "No models found")
        return
    if args.json:
        sys.stdout.write(standard_json([result.to_json() for result in results]))
        return
    rows = [
        [
            f"hf.co/{r.name}" if r.source == hub.HUGGING_FACE else r.name,
            r.description,
            r.backend,
            format_size(r.size),
            format_count(r.downloads),
            format_count(r.stars),
            r.source,
        ]
        for r in results
    ]
    sys.stdout.write(
        go_table(["NAME", "DESCRIPTION", "BACKEND", "SIZE", "DOWNLOADS", "STARS", "SOURCE"], rows)
    )


def add_commands(commands: Any) -> None:
    parser = commands.add_parser(
        "search",
        help="Search for models on Docker Hub and HuggingFace",
        description=_DESCRIPTION,
    )
    parser.add_argument("term", nargs="*", metavar="TERM", help="filter by name or description")
    parser.add_argument("-n", "--limit", type=int, default=32, help="Maximum number of results to show")
    parser.add_argument("--source", default="all", help="Source to search: all, dockerhub, huggingface")
    parser.add_argument("--json", action="store_true", help="Output results as JSON")
    takes(parser, _AtMostOneTerm("search", "[OPTIONS] [TERM]", "term", at_least=True))
    parser.set_defaults(handler=cmd_search)
