"""Anthropic request checks and error bodies."""

from __future__ import annotations

import pytest

from modelrunner.compat import anthropic as shapes
from modelrunner.errors import BadRequest


def test_error_types_follow_the_status() -> None:
    assert shapes.error_body(404, "gone") == {
        "type": "error",
        "error": {"type": "not_found_error", "message": "gone"},
    }
    assert shapes.error_type(400) == "invalid_request_error"
    assert shapes.error_type(503) == "overloaded_error"
    assert shapes.error_type(412) == "invalid_request_error"
    assert shapes.error_type(502) == "api_error"


def test_requests_are_checked() -> None:
    good = {
        "model": "m",
        "max_tokens": 3,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}],
    }
    assert shapes.check_request(good, count_tokens=False).model == "m"
    assert (
        shapes.check_request({"model": "m", "messages": [], "system": "s"}, count_tokens=True).system == "s"
    )
    for bad in (
        {"max_tokens": 3, "messages": []},
        {"model": "m", "max_tokens": 3},
        {"model": "m", "max_tokens": 0, "messages": []},
        {"model": "m", "messages": [{"role": "system", "content": "x"}]},
        {"model": "m", "messages": [{"role": "user", "content": [{"text": "no type"}]}]},
    ):
        with pytest.raises(BadRequest):
            shapes.check_request(bad, count_tokens=False)
