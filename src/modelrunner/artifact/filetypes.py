"""What a model file is, by its name alone, as DMR's `pkg/distribution/files/classify.go` decides it.

Used by the builder (which media type a file of a safetensors folder gets) and by the CNCF layer mapping
(which ModelPack kind a layer of an unknown media type is).
"""

from __future__ import annotations

from enum import Enum

from modelrunner.artifact import mediatypes as mt

__all__ = ["FileType", "classify_file", "weight_format"]


class FileType(Enum):
    UNKNOWN = "unknown"
    GGUF = "gguf"
    SAFETENSORS = "safetensors"
    DDUF = "dduf"
    CONFIG = "config"
    LICENSE = "license"
    CHAT_TEMPLATE = "chat_template"


_WEIGHT_FORMATS = {
    FileType.GGUF: mt.FORMAT_GGUF,
    FileType.SAFETENSORS: mt.FORMAT_SAFETENSORS,
    FileType.DDUF: mt.FORMAT_DDUF,
}
_LICENSE_WORDS = ("license", "licence", "copying", "notice")
_CONFIG_SUFFIXES = (".md", ".txt", ".json", ".vocab")


def classify_file(path: str) -> FileType:
    """files.Classify: on the base name, lowercased; the first rule that matches wins."""
    lower = path.rstrip("/").rsplit("/", 1)[-1].lower()
    if lower.endswith(".gguf"):
        return FileType.GGUF
    if lower.endswith(".safetensors"):
        return FileType.SAFETENSORS
    if lower.endswith(".dduf"):
        return FileType.DDUF
    if lower.endswith(".jinja") or "chat_template" in lower:
        return FileType.CHAT_TEMPLATE
    if any(word in lower for word in _LICENSE_WORDS):
        return FileType.LICENSE
    if lower.endswith(_CONFIG_SUFFIXES) or lower == "tokenizer.model":
        return FileType.CONFIG
    return FileType.UNKNOWN


def weight_format(kind: FileType) -> str | None:
    """The model format (a config's `format`) of a weight file's type; None for any other file."""
    return _WEIGHT_FORMATS.get(kind)


def extension(path: str) -> str:
    """Go's filepath.Ext: from the last dot of the last path element, or ""."""
    name = path.rsplit("/", 1)[-1]
    dot = name.rfind(".")
    return name[dot:] if dot >= 0 else ""
