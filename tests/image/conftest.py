"""The image test builds a container image (minutes to tens of minutes): it runs only when asked, with
MODELRUNNER_IMAGE_TEST=1 (`deploy/image/test` does; `.ci/run` runs it when the image definition changed)."""

from __future__ import annotations

import os

import pytest

collect_ignore_glob = [] if os.environ.get("MODELRUNNER_IMAGE_TEST") == "1" else ["test_*.py"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/image" in str(item.path):
            item.add_marker(pytest.mark.image)
