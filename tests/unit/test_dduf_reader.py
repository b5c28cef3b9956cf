from __future__ import annotations

import contextlib
import json
import random
import re
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from modelrunner.artifact.dduf import read_dduf
from modelrunner.artifact.units import format_size
from modelrunner.errors import InvalidModelFile
from tests.models import (
    tiny_dduf_entries,
    write_dduf_with_compressed_entry,
    write_dduf_with_entry_name,
    write_tiny_dduf,
)


def test_tiny_dduf(tmp_path: Path) -> None:
    path = write_tiny_dduf(tmp_path / "tiny.dduf")
    info = read_dduf(path)
    assert info.entries == [name for name, _ in tiny_dduf_entries()]
    assert info.size_bytes == path.stat().st_size
    assert info.size == format_size(path.stat().st_size)


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _zip(path: Path, entries: list[tuple[str, bytes]]) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        for name, content in entries:
            zf.writestr(name, content)
    return path


def _without(name: str) -> list[tuple[str, bytes]]:
    return [(n, c) for n, c in tiny_dduf_entries() if n != name]


def _replace(name: str, content: bytes) -> list[tuple[str, bytes]]:
    return [(n, content if n == name else c) for n, c in tiny_dduf_entries()]


def _local_name_differs(path: Path) -> Path:
    _zip(path, tiny_dduf_entries())
    data = path.read_bytes()
    # The first occurrence is the local header; the central directory keeps the real name.
    path.write_bytes(data.replace(b"vae/config.json", b"vae/confiX.json", 1))
    return path


def _duplicate_entry(path: Path) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns about the duplicate it is asked to write
        return _zip(path, [*tiny_dduf_entries(), ("vae/config.json", b"{}")])


HOSTILE: dict[str, Callable[[Path], Path]] = {
    "empty file": lambda p: _write(p, b""),
    "not a zip": lambda p: _write(p, b"GGUF" + b"\0" * 200),
    "truncated zip": lambda p: _write(p, write_tiny_dduf(p).read_bytes()[:-30]),
    "compressed entry": write_dduf_with_compressed_entry,
    "parent component": lambda p: write_dduf_with_entry_name(p, "../x.json"),
    "nested parent component": lambda p: write_dduf_with_entry_name(p, "vae/../../x.json"),
    "absolute name": lambda p: write_dduf_with_entry_name(p, "/abs.json"),
    "drive-letter name": lambda p: write_dduf_with_entry_name(p, "C:x.json"),
    "backslash": lambda p: write_dduf_with_entry_name(p, "vae\\c.json"),
    "NUL byte": lambda p: write_dduf_with_entry_name(p, "vae/a\x00b.json"),
    "empty component": lambda p: write_dduf_with_entry_name(p, "vae//c.json"),
    "dot component": lambda p: write_dduf_with_entry_name(p, "./vae/c.json"),
    "local header disagrees": _local_name_differs,
    "duplicate entry": _duplicate_entry,
    "no model_index.json": lambda p: _zip(p, _without("model_index.json")),
    "model_index.json not at the root": lambda p: _zip(
        p, [("sub/model_index.json", b"{}"), *_without("model_index.json")]
    ),
    "model_index.json not JSON": lambda p: _zip(p, _replace("model_index.json", b"{oops")),
    "model_index.json not UTF-8": lambda p: _zip(p, _replace("model_index.json", b"\xff\xfe")),
    "model_index.json a list": lambda p: _zip(p, _replace("model_index.json", b"[1]")),
    "folder not in the index": lambda p: _zip(
        p, _replace("model_index.json", json.dumps({"scheduler": ["diffusers", "DDIMScheduler"]}).encode())
    ),
    "folder without a config": lambda p: _zip(p, _without("vae/config.json")),
    "entry type not allowed": lambda p: _zip(p, [*tiny_dduf_entries(), ("vae/run.sh", b"echo")]),
}


@pytest.mark.parametrize("case", HOSTILE)
def test_hostile_dduf_refused(tmp_path: Path, case: str) -> None:
    path = HOSTILE[case](tmp_path / "hostile.dduf")
    with pytest.raises(InvalidModelFile) as err:
        read_dduf(path)
    message = err.value.message
    assert message.startswith("hostile.dduf: ") and len(message) > len("hostile.dduf: ")
    assert str(tmp_path) not in message


def test_messages_say_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(InvalidModelFile, match=re.escape("'vae/config.json' is compressed")):
        read_dduf(write_dduf_with_compressed_entry(tmp_path / "c.dduf"))
    with pytest.raises(InvalidModelFile, match=re.escape("'../x.json' is not a clean relative path")):
        read_dduf(write_dduf_with_entry_name(tmp_path / "n.dduf", "../x.json"))
    with pytest.raises(InvalidModelFile, match=r"model_index\.json is not valid UTF-8 JSON"):
        read_dduf(_zip(tmp_path / "j.dduf", _replace("model_index.json", b"{oops")))


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(InvalidModelFile, match=r"^missing\.dduf: cannot read file"):
        read_dduf(tmp_path / "missing.dduf")


def test_random_corruption_never_escapes_as_another_error(tmp_path: Path) -> None:
    valid = write_tiny_dduf(tmp_path / "tiny.dduf").read_bytes()
    rng = random.Random(7)
    path = tmp_path / "fuzz.dduf"
    for _ in range(250):
        data = bytearray(valid)
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        path.write_bytes(bytes(data[: rng.randrange(len(data))] if rng.random() < 0.2 else data))
        with contextlib.suppress(InvalidModelFile):
            read_dduf(path)
