"""Where this machine's model runner keeps its files, and how much each place takes (`df -v`, and what
`uninstall-runner` leaves): the model store, the runner home, and the engine cache that every runner home
of this user shares (llama.cpp builds, vLLM and diffusers environments: gigabytes that no verb removes).

The places are this shell's settings (MODEL_RUNNER_HOME, MODELS_PATH, XDG_CACHE_HOME), which are the local
daemon's when this CLI started it; a runner on another machine keeps its files there.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import NamedTuple


class Place(NamedTuple):
    what: str
    path: Path
    size: int


def runner_is_here() -> bool:
    """Whether the runner this CLI talks to is on this machine (its files are the places listed here)."""
    import urllib.parse

    from modelrunner import config

    target = config.client_target()
    return not target.explicit or config.is_loopback_host(
        urllib.parse.urlsplit(target.base_url).hostname or ""
    )


def engine_cache() -> Path:
    from modelrunner.engines.install import engine_cache_base

    return engine_cache_base()


def size_of(path: Path) -> int:
    from modelrunner.engines.install import folder_size

    return folder_size(path) if path.is_dir() else 0


def places() -> list[Place]:
    """The store, the runner home (which holds the store unless MODELS_PATH moves it, the installed
    engines, logs and settings), the engine cache and each of its entries."""
    from modelrunner import config

    store, home, cache = config.models_path(), config.runner_home(), engine_cache()
    found = [
        Place("Model store", store, size_of(store)),
        Place("Runner home", home, size_of(home)),
        Place("Engine cache", cache, size_of(cache)),
    ]
    if cache.is_dir():
        for entry in sorted(cache.iterdir()):
            if entry.is_dir():
                found.append(Place(f"  {entry.name}", entry, size_of(entry)))
    return found


def places_table() -> str:
    from modelrunner.cli.dmrformat import custom_size, go_table

    rows = [[place.what, custom_size(place.size), str(place.path)] for place in places()]
    return go_table(["WHERE", "SIZE", "PATH"], rows)


def engine_cache_note() -> str:
    """What `uninstall-runner` leaves behind and how to remove it."""
    cache = engine_cache()
    if not cache.is_dir():
        return f"No engine cache to keep ({cache} does not exist)."
    from modelrunner.cli.dmrformat import custom_size

    return (
        f"Kept: the engine cache, {custom_size(size_of(cache))} at {cache} (builds and environments shared "
        "by every runner home: a reinstall takes seconds).\n"
        f"To remove it too: rm -rf {shlex.quote(os.fspath(cache))}"
    )
