"""Reading calls written as text is linear in the text, whatever it holds (issue 36 item 1: a backtracking
expression took ~50 s over 10,000 unclosed `<parameter=a>`, and a stream re-read all it held on every piece),
and bounded: a text over MAX_CHARS, or one whose reading outlasts MAX_SECONDS, is left as text, with a log
line. The hostile texts are 1 MB; each must be read within 2 s of CPU (a generous bound for a loaded 2-core
machine: the old reading took hours over them), and an alarm ends a reading that runs away."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from types import FrameType

import pytest

from modelrunner.compat import tool_rescue
from modelrunner.compat.tool_rescue import Call, Holdback, Rescued, Tools, rescue

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}}
TOOLS: Tools = {"a": {}, "now": {}, "get_weather": WEATHER}
SIZE = 1024 * 1024
CPU_BOUND = 2.0
NOW = '<tool_call>{"name": "now", "arguments": {}}</tool_call>'


def _times(piece: str, size: int = SIZE) -> str:
    return piece * (size // len(piece))


HOSTILE = {
    "unclosed parameters": "<function=a>" + _times("<parameter=a>"),
    "unclosed parameters, closed function": "<function=a>" + _times("<parameter=a>") + "</function>",
    "parameter markers": "<function=a>" + _times("<parameter=") + "</function>",
    "function markers": _times("<function="),
    "open calls": _times("<tool_call>"),
    "closers": "<tool_call>" + _times("</tool_call>"),
    "braces": _times("{"),
    "brackets in an object": '{"a": ' + _times("["),
    "quotes": _times('"'),
    "backslashes in a string": '{"a": "' + _times("\\"),
    "angle brackets": "<tool_call>" + _times("<"),
    "a call's name left open": _times("<function=a"),
}


@pytest.fixture
def alarm() -> Iterator[None]:
    """Ends a reading that runs away (the old one would take hours) with a failure after 30 s."""

    def expire(signum: int, frame: FrameType | None) -> None:
        raise TimeoutError("the reading ran for 30 s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, 30)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _cpu(work: Callable[[], object]) -> tuple[float, object]:
    start = time.process_time()
    result = work()
    return time.process_time() - start, result


def _streamed(text: str, piece: int = 7) -> tuple[str, tuple[str, Rescued | None]]:
    holdback = Holdback(TOOLS)
    sent = "".join(holdback.feed(text[i : i + piece]) for i in range(0, len(text), piece))
    return sent, holdback.end()


@pytest.mark.parametrize("name", list(HOSTILE))
@pytest.mark.usefixtures("alarm")
def test_a_hostile_megabyte_is_read_at_once_and_left_as_text(name: str) -> None:
    text = HOSTILE[name]
    seconds, found = _cpu(lambda: rescue(text, TOOLS))
    assert found is None
    assert seconds < CPU_BOUND, f"{name}: {seconds:.2f} s"


@pytest.mark.parametrize("name", list(HOSTILE))
@pytest.mark.usefixtures("alarm")
def test_a_hostile_megabyte_streamed_is_read_once_and_comes_out_whole(name: str) -> None:
    text = HOSTILE[name]
    seconds, result = _cpu(lambda: _streamed(text))
    assert isinstance(result, tuple)
    sent, (held, found) = result
    assert found is None and sent + held == text
    assert seconds < CPU_BOUND, f"{name}: {seconds:.2f} s"


@pytest.mark.usefixtures("alarm")
def test_a_megabyte_of_valid_calls_is_every_call_read_once() -> None:
    text = _times(NOW + "\n")
    calls = len(text) // len(NOW + "\n")
    seconds, found = _cpu(lambda: rescue(text, TOOLS))
    assert found == Rescued("", [Call("now", {})] * calls)
    assert seconds < CPU_BOUND, f"{seconds:.2f} s"
    seconds, result = _cpu(lambda: _streamed(text))
    assert result == ("", ("", Rescued("", [Call("now", {})] * calls)))
    assert seconds < CPU_BOUND, f"{seconds:.2f} s"


@pytest.mark.usefixtures("alarm")
def test_a_megabyte_of_parameters_is_one_call() -> None:
    text = "<function=get_weather>" + _times("<parameter=city>Paris</parameter>\n") + "</function>"
    seconds, found = _cpu(lambda: rescue(text, TOOLS))
    assert found == Rescued("", [Call("get_weather", {"city": "Paris"})])
    assert seconds < CPU_BOUND, f"{seconds:.2f} s"


@pytest.mark.usefixtures("alarm")
def test_a_stream_held_from_a_marker_reads_each_piece_once() -> None:
    """The old Holdback searched everything it held for a closer on every piece: quadratic in the block."""
    text = '<tool_call>{"name": "get_weather", "arguments": {"city": "' + _times("x") + '"}}</tool_call>'
    seconds, result = _cpu(lambda: _streamed(text, piece=4))
    assert result == ("", ("", Rescued("", [Call("get_weather", {"city": "x" * SIZE})])))
    assert seconds < CPU_BOUND, f"{seconds:.2f} s"


def test_a_text_over_the_bound_is_left_as_text_unread_with_a_log_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(tool_rescue, "MAX_CHARS", len(NOW) * 2)
    assert rescue(NOW * 2, TOOLS) == Rescued("", [Call("now", {})] * 2)
    assert rescue(NOW * 3, TOOLS) is None
    (line,) = [r for r in caplog.records if r.msg == "tool_rescue_skipped"]
    assert vars(line)["fields"] == {"reason": "too_long", "chars": len(NOW) * 3}


def test_a_stream_over_the_bound_passes_as_the_text_it_is(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(tool_rescue, "MAX_CHARS", len(NOW) * 2)
    holdback = Holdback(TOOLS)
    assert holdback.feed(NOW) == "" and holdback.feed(NOW) == ""
    assert holdback.feed(NOW) == NOW * 3  # over the bound: what was held goes out, and all after it
    assert holdback.feed("more") == "more"
    assert holdback.end() == ("", None)
    assert [vars(r)["fields"]["reason"] for r in caplog.records if r.msg == "tool_rescue_skipped"] == [
        "too_long"
    ]


def test_a_reading_that_outlasts_its_time_is_left_as_text_with_a_log_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(tool_rescue, "MAX_SECONDS", -1.0)  # every deadline already past
    assert rescue(NOW, TOOLS) is None
    (line,) = [r for r in caplog.records if r.msg == "tool_rescue_skipped"]
    assert vars(line)["fields"] == {"reason": "too_slow", "chars": len(NOW)}


@pytest.mark.parametrize("size", [1, 2, 3, 5, 11, 12, 13])
def test_markers_and_closers_cut_anywhere_by_the_stream_are_found(size: int) -> None:
    text = (
        "Sure. <tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n"
        "</tool_call>\n" + NOW + "  \n<function=now></function>"
    )
    sent, (held, found) = _streamed(text, piece=size)
    assert sent == "Sure. " and held == ""
    assert found == Rescued("", [Call("get_weather", {"city": "Paris"}), Call("now", {}), Call("now", {})])
