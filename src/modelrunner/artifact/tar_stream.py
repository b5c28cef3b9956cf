"""Write a tar archive as a stream of chunks, without building it anywhere first."""

from __future__ import annotations

import tarfile
from collections.abc import Iterable, Iterator
from pathlib import Path

BLOCK = 512
READ_CHUNK = 1024 * 1024


def tar_header(name: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = size
    info.mode = 0o644
    info.mtime = 0  # archives of one model are byte-identical
    return info.tobuf(format=tarfile.GNU_FORMAT)


def file_chunks(path: Path) -> Iterator[bytes]:
    with open(path, "rb") as handle:
        while chunk := handle.read(READ_CHUNK):
            yield chunk


def tar_chunks(entries: Iterable[tuple[str, int, Iterable[bytes]]]) -> Iterator[bytes]:
    """Entries are (name, size, content chunks); the content must add up to exactly `size` bytes."""
    for name, size, content in entries:
        yield tar_header(name, size)
        written = 0
        for chunk in content:
            written += len(chunk)
            yield chunk
        if written != size:
            raise ValueError(f"{name} changed while it was archived ({written} bytes, expected {size})")
        yield b"\0" * (-size % BLOCK)
    yield b"\0" * (2 * BLOCK)
