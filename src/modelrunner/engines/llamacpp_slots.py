"""llama-server's slot persistence (tools/server, b11434): `--slot-save-path DIR`, `GET /slots` (which
slots hold a prompt: an idle slot that served a task has an `id_task`), `POST /slots/{id}?action=save` and
`?action=restore` with `{"filename": ...}` (a plain file name inside DIR). A save writes the slot's tokens
and its KV cells; a restore puts them back into a slot, so a prompt that shares the prefix reuses it.

A restore is checked, not trusted (a no-op restore, llama.cpp#26676): the saved tokens, read from the slot
file when it is saved, are sent back to the restored slot as a one-token completion, whose `timings.cache_n`
says how many of them came from the cache. /slots does not show a slot's tokens, so the file is the source:
b11434 writes `ggsq`, version 4, three header words, the token count, then the tokens (int32, little
endian); a file of any other layout is not kept, as its restore could not be checked."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from modelrunner import http1
from modelrunner.engines.base import SavedSlot, SlotError

SLOT_SAVE_FLAG = "--slot-save-path"
FILE_MAGIC, FILE_VERSION = b"qsgg", 4  # llama.cpp's LLAMA_STATE_SEQ_MAGIC 'ggsq' as written, b11434's version
TOKENS_AT = 20  # offset of the token count in a version 4 slot file; the tokens follow it


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


async def _slots(socket: Path, timeout: float) -> list[dict[str, Any]]:
    """GET /slots: each slot's state."""
    slots = await _call(socket, "GET", "/slots", timeout)
    if not isinstance(slots, list):
        raise SlotError("GET /slots: not a list of slots")
    return [s for s in slots if isinstance(s, dict)]


async def held_slots(socket: Path, timeout: float) -> list[int]:
    """Slots that hold a prompt and are not working on one now."""
    slots = await _slots(socket, timeout)
    return [int(s["id"]) for s in slots if s.get("id_task") is not None and not s.get("is_processing")]


async def working_slots(socket: Path, timeout: float) -> int | None:
    """How many slots work on a request now; None when the engine does not say in time."""
    try:
        slots = await _slots(socket, timeout)
    except (SlotError, OSError):
        return None
    return sum(1 for s in slots if s.get("is_processing"))


async def save_slots(socket: Path, folder: Path, timeout: float) -> list[SavedSlot]:
    saved = []
    for slot in await held_slots(socket, timeout):
        name = slot_file(slot)
        answer = await _call(socket, "POST", f"/slots/{slot}?action=save", timeout, {"filename": name})
        tokens = int(answer.get("n_saved", 0)) if isinstance(answer, dict) else 0
        path = folder / name
        if tokens > 0 and path.is_file():
            try:
                prompt = saved_prompt(path, tokens)
            except SlotError:
                path.unlink(missing_ok=True)
                raise
            saved.append(SavedSlot(slot, name, tokens, path.stat().st_size, prompt))
        else:
            path.unlink(missing_ok=True)
    return saved


def saved_prompt(path: Path, tokens: int) -> tuple[int, ...]:
    """The `tokens` tokens a slot file holds; SlotError when the file is not laid out as b11434's."""
    with open(path, "rb") as handle:
        head = handle.read(TOKENS_AT + 4)
        body = handle.read(4 * tokens)
    if len(head) < TOKENS_AT + 4 or head[:4] != FILE_MAGIC or head[4:8] != struct.pack("<I", FILE_VERSION):
        raise SlotError(f"{path.name}: not a version {FILE_VERSION} slot file")
    if struct.unpack_from("<I", head, TOKENS_AT)[0] != tokens or len(body) != 4 * tokens:
        raise SlotError(f"{path.name}: its token count is not the {tokens} the engine saved")
    return struct.unpack(f"<{tokens}i", body)


async def restore_slot(socket: Path, slot: SavedSlot, timeout: float) -> int:
    body = {"filename": slot.filename}
    answer = await _call(socket, "POST", f"/slots/{slot.slot}?action=restore", timeout, body)
    restored = int(answer.get("n_restored", 0)) if isinstance(answer, dict) else 0
    if restored != slot.tokens:  # a restore that did nothing (llama.cpp#26676) must not pass for one
        raise SlotError(f"slot {slot.slot}: {restored} of {slot.tokens} tokens restored")
    return restored


async def probe_slot(socket: Path, slot: SavedSlot, timeout: float) -> int:
    """The saved prompt sent back to its restored slot (one token predicted, the cache kept): how many of
    its tokens the engine took from the cache (all but the last when the restore took)."""
    body = {"prompt": list(slot.prompt), "id_slot": slot.slot, "cache_prompt": True, "n_predict": 1}
    answer = await _call(socket, "POST", "/completion", timeout, body)
    timings = answer.get("timings") if isinstance(answer, dict) else None
    cached = timings.get("cache_n") if isinstance(timings, dict) else None
    if not isinstance(cached, int):
        raise SlotError("POST /completion: no timings.cache_n in the answer")
    return cached
