"""llama-server's "input is too large" error is read in linear time (issue 36: input from an engine is input
too): a hostile 1 MiB error body, the phrase's start repeated, took ~10 s on the event loop with one pattern
that had `.*` between its two parts."""

from __future__ import annotations

import time

from modelrunner.server.served_call import InputTooLong, input_too_long

MESSAGE = (
    "input (3000 tokens) is too large to process. increase the physical batch size (current batch size: 512)"
)


def test_the_engine_error_is_read() -> None:
    found = input_too_long(500, MESSAGE)
    assert isinstance(found, InputTooLong) and found.limit == 512 and "(3000 tokens)" in found.message
    assert input_too_long(400, MESSAGE) is None
    assert input_too_long(500, "input (3000 tokens) is too large to process") is None


def test_a_hostile_error_body_is_read_in_linear_time() -> None:
    hostile = "input (1 tokens) is too large to process" * 26_000  # ~1 MiB, no batch size anywhere
    started = time.process_time()
    assert input_too_long(500, hostile) is None
    assert time.process_time() - started < 1.0  # was ~10 s; linear, it is milliseconds
