"""The tokens of a llama-server slot file (engines/llamacpp_slots.py `saved_prompt`): what a restore is
checked with. The layout is b11434's (version 4); the integration tests save real ones."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import pytest

from modelrunner.engines.base import SlotError
from modelrunner.engines.llamacpp_slots import saved_prompt

TOKENS = (1, 259, 279, 7)


def slot_file(path: Path, magic: bytes = b"qsgg", version: int = 4, count: int = len(TOKENS)) -> Path:
    header = magic + struct.pack("<IIiII", version, count + 4, -1, 1, count)
    path.write_bytes(header + struct.pack(f"<{len(TOKENS)}i", *TOKENS) + b"kv cells")
    return path


def test_the_tokens_are_read_from_a_version_4_slot_file(tmp_path: Path) -> None:
    assert saved_prompt(slot_file(tmp_path / "slot-0.bin"), len(TOKENS)) == TOKENS


@pytest.mark.parametrize(
    ("fields", "saved", "message"),
    [
        ({"magic": b"ggsn"}, 4, "not a version 4 slot file"),
        ({"version": 3}, 4, "not a version 4 slot file"),
        ({}, 5, "not the 5 the engine saved"),  # the engine said 5 tokens, the file holds 4
        ({"count": 9}, 9, "not the 9 the engine saved"),  # the file says 9 and ends before them
    ],
)
def test_a_file_of_another_layout_is_refused(
    tmp_path: Path, fields: dict[str, Any], saved: int, message: str
) -> None:
    path = slot_file(tmp_path / "slot-0.bin", **fields)
    with pytest.raises(SlotError, match=message):
        saved_prompt(path, saved)
