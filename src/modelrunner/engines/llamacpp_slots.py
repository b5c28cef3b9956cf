"""llama-server's slot persistence (tools/server, b11434): `--slot-save-path DIR`, `GET /slots` (which
slots hold a prompt: an idle slot that served a task has an `id_task`), `POST /slots/{id}?action=save` and
`?action=restore` with `{"filename": ...}` (a plain file name inside DIR). A save writes the slot's tokens
and its KV cells; a restore puts them back into a slot, so a prompt that shares the prefix reuses it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from modelrunner import http1
from modelrunner.engines.base import SavedSlot, SlotError

SLOT_SAVE_FLAG = "--slot-save-path"


def slot_file(slot: int) -> str:
    return f"slot-{slot}.bin"


async def _call(socket: Path, method: str, path: str, timeout: float, body: Any = None) -> Any:
    raw = None if body is None else json.dumps(body).encode()
    answer = await http1.request(str(socket), method, path, raw, timeout=timeout)
    if answer is None:
        raise SlotError(f"{method} {path}: no answer within {timeout:g} s")
    status, data = answer
    try:
        decoded = json.loads(data)
    except ValueError:
        decoded = None
    if status != 200:
        message = decoded.get("error", {}).get("message") if isinstance(decoded, dict) else None
        raise SlotError(f"{method} {path}: {status} {message or data[:200].decode('utf-8', 'replace')}")
    return decoded


async def held_slots(socket: Path, timeout: float) -> list[int]:
    """Slots that hold a prompt and are not working on one now."""
    slots = await _call(socket, "GET", "/slots", timeout)
    if not isinstance(slots, list):
        raise SlotError("GET /slots: not a list of slots")
    return [
        int(s["id"])
        for s in slots
        if isinstance(s, dict) and s.get("id_task") is not None and not s.get("is_processing")
    ]


async def save_slots(socket: Path, folder: Path, timeout: float) -> list[SavedSlot]:
    saved = []
    for slot in await held_slots(socket, timeout):
        name = slot_file(slot)
        answer = await _call(socket, "POST", f"/slots/{slot}?action=save", timeout, {"filename": name})
        tokens = int(answer.get("n_saved", 0)) if isinstance(answer, dict) else 0
        path = folder / name
        if tokens > 0 and path.is_file():
            saved.append(SavedSlot(slot, name, tokens, path.stat().st_size))
        else:
            path.unlink(missing_ok=True)
    return saved


async def restore_slot(socket: Path, slot: SavedSlot, timeout: float) -> int:
    body = {"filename": slot.filename}
    answer = await _call(socket, "POST", f"/slots/{slot.slot}?action=restore", timeout, body)
    restored = int(answer.get("n_restored", 0)) if isinstance(answer, dict) else 0
    if restored != slot.tokens:  # a restore that did nothing (llama.cpp#26676) must not pass for one
        raise SlotError(f"slot {slot.slot}: {restored} of {slot.tokens} tokens restored")
    return restored
