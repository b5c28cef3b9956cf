"""What the dashboard offers (issue 37): Install only for an engine an install can make usable here (the
`installable` field of `GET /engines/info`), and the image steps default that `model run` leaves to the
engine, so one request makes one picture wherever it is asked from."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from fastapi import FastAPI
from fastapi.testclient import TestClient

import modelrunner.server.dashboard
from modelrunner.engines.diffusers_server.params import ImageRequest
from modelrunner.engines.registry import EngineRegistry, default_registry
from modelrunner.server.engines_api import build_engines_router
from modelrunner.server.errors import install_error_handlers

STATIC = Path(modelrunner.server.dashboard.__file__).parent / "static" / "js" / "pages"


def test_engines_info_says_which_engines_can_be_installed_here() -> None:
    """sglang on Linux runs here (`supported`) but modelrunner cannot install it: its Install failed."""
    app = FastAPI()
    install_error_handlers(app)
    app.include_router(
        build_engines_router(EngineRegistry({engine.name: engine for engine in default_registry()}))
    )
    engines = TestClient(app).get("/engines/info").json()["engines"]
    assert engines["llama.cpp"]["installable"] is True
    assert engines["diffusers"]["installable"] is True
    assert engines["sglang"]["supported"] is True and engines["sglang"]["installable"] is False
    refused = TestClient(app).post("/engines/install-backend", json={"backend": "sglang"})
    assert refused.status_code == 400 and "cannot be installed" in refused.text
    page = (STATIC / "engines.js").read_text()
    assert "e.installable === false" in page  # the page reads the field, not the platform alone


def test_one_default_for_image_steps() -> None:
    engine_default = {f.name: f.default for f in dataclasses.fields(ImageRequest)}["num_inference_steps"]
    page = (STATIC / "images.js").read_text()
    [dashboard] = re.findall(r'name: "steps", min: 1, max: 150, value: (\d+)', page)
    assert int(dashboard) == engine_default
    import argparse

    from modelrunner.cli import build_parser

    commands = next(a for a in build_parser(verb="run")._actions if isinstance(a, argparse._SubParsersAction))
    steps = next(a for a in commands.choices["run"]._actions if "--steps" in a.option_strings)
    assert f"default {engine_default}" in str(steps.help)
