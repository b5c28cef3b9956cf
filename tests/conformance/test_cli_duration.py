"""Ages and expiries in the CLI (`ls` CREATED, `ps` UNTIL, `ls --openai`) as DMR prints them: docker/go-units
v0.5.0 `HumanDuration` (duration.go), which DMR's CLI calls (go.mod: github.com/docker/go-units)."""

from __future__ import annotations

import pytest

from modelrunner.cli.render import ago, human_duration

MS = 0.001
SECOND = 1
MINUTE = 60
HOUR = 3600
DAY = 24 * HOUR
WEEK = 7 * DAY
MONTH = 30 * DAY
YEAR = 365 * DAY


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        # go-units duration_test.go: TestHumanDuration, every case
        (450 * MS, "Less than a second"),
        (1 * SECOND, "1 second"),
        (45 * SECOND, "45 seconds"),
        (46 * SECOND, "46 seconds"),
        (59 * SECOND, "59 seconds"),
        (60 * SECOND, "About a minute"),
        (1 * MINUTE, "About a minute"),
        (3 * MINUTE, "3 minutes"),
        (35 * MINUTE, "35 minutes"),
        (35 * MINUTE + 40 * SECOND, "35 minutes"),
        (45 * MINUTE, "45 minutes"),
        (45 * MINUTE + 40 * SECOND, "45 minutes"),
        (46 * MINUTE, "46 minutes"),
        (59 * MINUTE, "59 minutes"),
        (1 * HOUR, "About an hour"),
        (1 * HOUR + 29 * MINUTE, "About an hour"),
        (1 * HOUR + 31 * MINUTE, "2 hours"),
        (1 * HOUR + 59 * MINUTE, "2 hours"),
        (3 * HOUR, "3 hours"),
        (3 * HOUR + 29 * MINUTE, "3 hours"),
        (3 * HOUR + 31 * MINUTE, "4 hours"),
        (3 * HOUR + 59 * MINUTE, "4 hours"),
        (3 * HOUR + 60 * MINUTE, "4 hours"),
        (24 * HOUR, "24 hours"),
        (1 * DAY + 12 * HOUR, "36 hours"),
        (2 * DAY, "2 days"),
        (7 * DAY, "7 days"),
        (13 * DAY + 5 * HOUR, "13 days"),
        (2 * WEEK, "2 weeks"),
        (2 * WEEK + 4 * DAY, "2 weeks"),
        (3 * WEEK, "3 weeks"),
        (4 * WEEK, "4 weeks"),
        (4 * WEEK + 3 * DAY, "4 weeks"),
        (1 * MONTH, "4 weeks"),
        (1 * MONTH + 2 * WEEK, "6 weeks"),
        (2 * MONTH, "2 months"),
        (2 * MONTH + 2 * WEEK, "2 months"),
        (3 * MONTH, "3 months"),
        (3 * MONTH + 1 * WEEK, "3 months"),
        (5 * MONTH + 2 * WEEK, "5 months"),
        (13 * MONTH, "13 months"),
        (23 * MONTH, "23 months"),
        (24 * MONTH, "24 months"),
        (24 * MONTH + 2 * WEEK, "2 years"),
        (3 * YEAR + 2 * MONTH, "3 years"),
        # duration.go's arithmetic where rounding decides (checked against go-units built with Go):
        # hours = int(d.Hours() + 0.5), half up, never to even
        (2 * HOUR + 30 * MINUTE, "3 hours"),
        (4 * HOUR + 30 * MINUTE, "5 hours"),
        # days, weeks and months come from those rounded hours, not from whole days
        (47 * HOUR + 30 * MINUTE, "2 days"),
        (13 * DAY + 23 * HOUR + 30 * MINUTE, "2 weeks"),
        (59 * DAY + 23 * HOUR + 30 * MINUTE, "2 months"),
        # years from the whole hours (so go-units says "1 years" half an hour before two years)
        (2 * YEAR - 30 * MINUTE, "1 years"),
        (2 * YEAR - 31 * MINUTE, "24 months"),
        # seconds and minutes truncate; a negative duration is less than a second
        (1.999, "1 second"),
        (119.9, "About a minute"),
        (-5 * SECOND, "Less than a second"),
    ],
)
def test_human_duration_is_go_units(seconds: float, text: str) -> None:
    assert human_duration(seconds) == text


def test_ago_appends_ago_and_leaves_unknown_times_blank() -> None:
    # cmd/cli/commands/list.go: units.HumanDuration(time.Since(created)) + " ago"
    assert ago(1_000_000, now=1_000_000 + 3 * HOUR + 31 * MINUTE) == "4 hours ago"
    assert ago(0, now=1_000_000) == ""
