"""The image test builds a container image (minutes to tens of minutes): it runs only when asked, with
MODELRUNNER_IMAGE_TEST=1 (deploy/image/test does; scripts/test runs it when the image definition changed)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

collect_ignore_glob = [] if os.environ.get("MODELRUNNER_IMAGE_TEST") == "1" else ["test_*.py"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/image" in str(item.path):
            item.add_marker(pytest.mark.image)


@pytest.fixture(autouse=True, scope="session")
def _docker_config_for_buildah() -> None:
    """buildah takes `$DOCKER_CONFIG/config.json` as its auth file and fails when it is missing: the test
    session's own Docker config folder (tests/conftest.py) gets an empty one, before the module-scoped
    image build needs it."""
    folder = Path(os.environ["DOCKER_CONFIG"])
    folder.mkdir(parents=True, exist_ok=True)
    auth = folder / "config.json"
    if not auth.exists():
        auth.write_text("{}\n")
