"""DDUF (Diffusers Unified Format) validation.

A DDUF is a ZIP archive of STORED entries that consumers read in place, by offset. `huggingface_hub`'s
reader checks the DDUF structure (model_index.json, one config per component folder) but accepts entry names
such as `../x.json` or `/x.json` and trusts each local header. So the archive is walked here first: every
entry stored and unencrypted, its name a clean relative path, its local header agreeing with the central
directory, its data inside the file.
"""

from __future__ import annotations

import re
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from huggingface_hub import read_dduf_file

from modelrunner.artifact.units import format_size
from modelrunner.errors import InvalidModelFile

__all__ = ["DDUFInfo", "read_dduf"]

_INDEX = "model_index.json"
_MAX_INDEX_BYTES = 16 << 20  # huggingface_hub reads model_index.json whole
_LOCAL_HEADER_SIG = b"PK\x03\x04"
_LOCAL_HEADER_LEN = 30
_FLAG_ENCRYPTED = 0x1
_FLAG_UTF8 = 0x800


@dataclass(frozen=True)
class DDUFInfo:
    size_bytes: int
    size: str
    entries: list[str]


def _name_problem(name: str) -> str | None:
    if not name:
        return "is empty"
    if "\x00" in name:
        return "contains a NUL byte"
    if "\\" in name:
        return "contains a backslash"
    if name.startswith("/") or re.match(r"[A-Za-z]:", name):
        return "is absolute"
    if any(part in ("", ".", "..") for part in name.split("/")):
        return "is not a clean relative path (empty, '.' or '..' component)"
    return None


def _check_entry(archive: str, info: zipfile.ZipInfo, raw: BinaryIO, size: int) -> None:
    name = info.orig_filename  # zipfile cuts `filename` at NUL; the original keeps what the archive says

    def bad(problem: str) -> InvalidModelFile:
        return InvalidModelFile(f"{archive}: entry {name[:100]!r} {problem}")

    problem = _name_problem(name)
    if problem:
        raise bad(problem)
    if info.compress_type != zipfile.ZIP_STORED:
        raise bad("is compressed; DDUF entries must be stored uncompressed")
    if info.flag_bits & _FLAG_ENCRYPTED:
        raise bad("is encrypted")
    if info.file_size != info.compress_size:
        raise bad("has a stored size that differs from its compressed size")

    if not 0 <= info.header_offset < size:
        raise bad("has a local header outside the file")
    raw.seek(info.header_offset)
    header = raw.read(_LOCAL_HEADER_LEN)
    if len(header) < _LOCAL_HEADER_LEN or header[:4] != _LOCAL_HEADER_SIG:
        raise bad("has no valid local header")
    method = int.from_bytes(header[8:10], "little")
    name_len = int.from_bytes(header[26:28], "little")
    extra_len = int.from_bytes(header[28:30], "little")
    encoding = "utf-8" if info.flag_bits & _FLAG_UTF8 else "cp437"
    if method != zipfile.ZIP_STORED or raw.read(name_len) != name.encode(encoding):
        raise bad("has a local header that disagrees with the central directory")
    data_end = info.header_offset + _LOCAL_HEADER_LEN + name_len + extra_len + info.compress_size
    if data_end > size:
        raise bad("has data past the end of the file")


def read_dduf(path: Path) -> DDUFInfo:
    """Validates a DDUF file and lists its entries; anything wrong raises InvalidModelFile."""
    archive = path.name
    try:
        size = path.stat().st_size
        with path.open("rb") as raw:
            try:
                with zipfile.ZipFile(raw) as zf:
                    infos = zf.infolist()
            except Exception:  # zipfile raises many kinds on bad input (BadZipFile, unsupported methods, ...)
                raise InvalidModelFile(f"{archive}: not a valid ZIP archive") from None
            seen: set[str] = set()
            for info in infos:
                _check_entry(archive, info, raw, size)
                if info.orig_filename in seen:
                    raise InvalidModelFile(f"{archive}: duplicate entry {info.orig_filename[:100]!r}")
                seen.add(info.orig_filename)
        index = next((info for info in infos if info.orig_filename == _INDEX), None)
        if index is None:
            raise InvalidModelFile(f"{archive}: no {_INDEX} at the root of the archive")
        if index.file_size > _MAX_INDEX_BYTES:
            raise InvalidModelFile(f"{archive}: {_INDEX} is larger than {_MAX_INDEX_BYTES} bytes")
    except OSError as e:
        raise InvalidModelFile(f"{archive}: cannot read file ({e.strerror or type(e).__name__})") from None

    try:
        read_dduf_file(path)  # DDUF structure: index content, one config file per component folder
    except ValueError:  # from decoding and parsing the index
        raise InvalidModelFile(f"{archive}: {_INDEX} is not valid UTF-8 JSON") from None
    except Exception as e:  # hostile input: whatever the library raises means "not a valid DDUF"
        raise InvalidModelFile(f"{archive}: not a valid DDUF file: {_describe(e, path)}") from None
    return DDUFInfo(size_bytes=size, size=format_size(size), entries=[info.orig_filename for info in infos])


def _describe(error: Exception, path: Path) -> str:
    """The library's message, without any filesystem path in it."""
    message = str(error) or type(error).__name__
    for text in (str(path), str(path.resolve()), str(path.parent)):
        message = message.replace(text, path.name)
    return message[:300]
