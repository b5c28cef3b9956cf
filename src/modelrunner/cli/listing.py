"""`model ls` as DMR filters and lists (`cmd/cli/commands/list.go`): the `[MODEL]` filter, `--openai` and
`--openaiurl`. (The table of `ls` itself is drawn by cli/models.py.)"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any

from modelrunner.cli.common import UsageError

if TYPE_CHECKING:
    from modelrunner.client_types import Model


def normalize_filter(text: str) -> str:
    """DMR's normalizeModelFilter: a name without a `/` is in the `ai/` namespace."""
    return text if "/" in text else "ai/" + text


def _without_registry(tag: str) -> str:
    """A stored tag as DMR's filter sees it: without the default registry (`index.docker.io/`,
    `docker.io/`), which DMR's `/models` leaves out of its names."""
    for prefix in ("index.docker.io/", "docker.io/"):
        if tag.startswith(prefix):
            return tag[len(prefix) :]
    return tag


def matches(tag: str, wanted: str) -> bool:
    """DMR's matchesModelFilter: the whole reference when the filter has a tag, else the repository."""
    tag = _without_registry(tag)
    if ":" in wanted:
        return tag == wanted
    return tag.split(":", 1)[0] == wanted


def filter_models(models: list[Model], text: str) -> list[Model]:
    """Models with a tag the filter matches, each keeping only its matching tags."""
    wanted = normalize_filter(text)
    out = []
    for model in models:
        tags = [tag for tag in model.tags if matches(tag, wanted)]
        if tags:
            out.append(model.with_tags(tags))
    return out


def openai_listing(args: Any) -> int:
    """`ls --openai` (this daemon's OpenAI model list as JSON) and `ls --openaiurl URL` (any OpenAI
    endpoint's: a MODEL NAME / CREATED table, or JSON)."""
    from modelrunner.cli.dmrformat import go_table, openai_model_view, standard_json
    from modelrunner.cli.render import human_duration
    from modelrunner.client import Client

    if args.quiet:
        flag = "--openaiurl" if args.openaiurl else "--openai"
        raise UsageError(f"--quiet flag cannot be used with {flag} flag")
    if args.openaiurl:
        listing = Client.for_openai_url(args.openaiurl).list_openai()
        wanted = args.model
    else:
        from modelrunner.cli.common import client

        listing = client(quiet=True).list_openai()
        wanted = normalize_filter(args.model) if args.model else None
    if wanted:
        listing["data"] = [m for m in listing.get("data") or [] if matches(str(m.get("id", "")), wanted)]
    if args.json or not args.openaiurl:
        listing["data"] = [openai_model_view(m) for m in listing.get("data") or []]
        sys.stdout.write(standard_json(listing))
        return 0
    now = time.time()
    rows = [
        [str(m.get("id", "")), human_duration(now - float(m.get("created") or 0)) + " ago"]
        for m in sorted(listing.get("data") or [], key=lambda m: str(m.get("id", "")).lower())
    ]
    sys.stdout.write(go_table(["MODEL NAME", "CREATED"], rows))
    return 0
