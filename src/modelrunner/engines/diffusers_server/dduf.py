"""Unpacking a DDUF file into a folder that `DiffusionPipeline.from_pretrained` can load.

diffusers 0.41+ no longer reads DDUF itself. The archive is checked before anything is written: every entry
stored (not compressed) and unencrypted, its name a clean relative path. zipfile then checks each local
header against the central directory and each entry's CRC while copying. The folder is filled under a
temporary name and renamed, so a half-unpacked pipeline is never loaded; a finished one is reused.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import zipfile
from pathlib import Path, PurePosixPath

INDEX = "model_index.json"
COMPLETE_MARK = ".unpacked"  # written last, so its presence means every entry is there
_COPY_BLOCK = 1 << 20


class BadDDUF(Exception):
    """The file is not a DDUF this server will unpack; the message names the entry and the problem."""


def entry_problem(info: zipfile.ZipInfo) -> str | None:
    """Why one entry must not be unpacked, or None."""
    name = info.orig_filename  # `filename` is cut at NUL and has backslashes turned into slashes
    if not name or "\x00" in name or "\\" in name:
        return "has an empty name, a NUL byte or a backslash"
    path = PurePosixPath(name)
    if path.is_absolute() or (len(name) > 1 and name[1] == ":"):
        return "is an absolute path"
    if any(part in (".", "..") for part in name.rstrip("/").split("/")) or "//" in name:
        return "is not a clean relative path"
    if info.compress_type != zipfile.ZIP_STORED:
        return "is compressed; DDUF entries must be stored"
    if info.flag_bits & 0x1:
        return "is encrypted"
    return None


def check_archive(archive: zipfile.ZipFile) -> list[zipfile.ZipInfo]:
    """The archive's file entries, once every entry passed `entry_problem`; BadDDUF otherwise."""
    files: list[zipfile.ZipInfo] = []
    seen: set[str] = set()
    for info in archive.infolist():
        problem = entry_problem(info)
        if problem:
            raise BadDDUF(f"entry {info.orig_filename[:100]!r} {problem}")
        if info.orig_filename in seen:
            raise BadDDUF(f"entry {info.orig_filename[:100]!r} appears twice")
        seen.add(info.orig_filename)
        if not info.is_dir():
            files.append(info)
    if INDEX not in seen:
        raise BadDDUF(f"no {INDEX} at the root of the archive")
    return files


def unpacked_folder(dduf: Path, cache_root: Path) -> Path:
    return cache_root / dduf.name


def unpack(dduf: Path, cache_root: Path) -> Path:
    """The folder holding dduf's entries under cache_root, unpacking it first when needed."""
    final = unpacked_folder(dduf, cache_root)
    if (final / COMPLETE_MARK).is_file():
        return final
    try:
        archive = zipfile.ZipFile(dduf)
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        raise BadDDUF(f"{dduf.name} is not a readable ZIP archive ({exc.__class__.__name__})") from None
    with archive:
        entries = check_archive(archive)
        cache_root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=cache_root, prefix=f".{dduf.name}."))
        try:
            for info in entries:
                target = staging.joinpath(*info.orig_filename.split("/"))
                # Belt and braces after entry_problem: nothing may land outside the staging folder.
                if not target.resolve().is_relative_to(staging.resolve()):
                    raise BadDDUF(f"entry {info.orig_filename[:100]!r} escapes the folder")
                target.parent.mkdir(parents=True, exist_ok=True)
                try:
                    with archive.open(info) as source, open(target, "xb") as sink:
                        shutil.copyfileobj(source, sink, _COPY_BLOCK)
                except zipfile.BadZipFile as exc:  # local header or CRC disagrees with the directory
                    raise BadDDUF(f"entry {info.orig_filename[:100]!r} is damaged ({exc})") from None
            (staging / COMPLETE_MARK).write_text(f"{dduf.stat().st_size}\n")
            if final.exists():  # left by an unpack that died before its mark: replace it
                shutil.rmtree(final)
            try:
                os.rename(staging, final)
            except OSError:
                if not (final / COMPLETE_MARK).is_file():
                    raise
                shutil.rmtree(staging)  # another process finished first; its copy is as good
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return final
