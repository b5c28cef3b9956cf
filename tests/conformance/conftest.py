"""DMR conformance: each test names the upstream file (docker/model-runner at 642c7211) whose behaviour it
follows. They start real daemons and real CLI processes, so they run with the integration tests."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/conformance" in str(item.path):
            item.add_marker(pytest.mark.integration)
