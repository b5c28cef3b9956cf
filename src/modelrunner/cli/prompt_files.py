"""Files named in a chat prompt, as DMR's `run` reads them (`cmd/cli/commands/images.go`):

* `@file` (or `@"name with spaces"`, `@'...'`) is replaced by the file's text; a file that cannot be read
  is left as written, and an image is left for the next step;
* image paths (`/abs/pic.png`, `./pic.jpg`, quoted paths; jpg, jpeg, png, webp; at most 100 MB) become
  `image_url` parts with a data URI, and leave the text.
"""

from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import Any

MAX_IMAGE_BYTES = 100 * 1024 * 1024
_INCLUSION = re.compile(r"""@(?:"([^"]+)"|'([^']+)'|([^\s"']+))""")
_IMAGE = re.compile(
    r'"([^"]+?\.(?i:jpg|jpeg|png|webp))"'
    r"|'([^']+?\.(?i:jpg|jpeg|png|webp))'"
    r"""|(?:[a-zA-Z]:[/\\]|[/\\]|\./)[^\n"']*?\.(?i:jpg|jpeg|png|webp)\b"""
)
_IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp")
_UNESCAPES = {"\\ ": " ", "\\(": "(", "\\)": ")", "\\[": "[", "\\]": "]", "\\{": "{", "\\}": "}"}
_UNESCAPES |= {"\\$": "$", "\\&": "&", "\\;": ";", "\\'": "'", "\\\\": "\\", "\\*": "*", "\\?": "?"}
_UNESCAPES |= {"\\~": "~"}
_ESCAPED = re.compile("|".join(re.escape(k) for k in _UNESCAPES))


class PromptFileError(Exception):
    """An image that was named but cannot be attached (too large, not an image)."""


def normalize_path(path: str) -> str:
    """Shell escapes in a pasted path (`my\\ file.png`) undone, as DMR's normalizeFilePath does."""
    return _ESCAPED.sub(lambda m: _UNESCAPES[m.group(0)], path)


def sniff_image_type(head: bytes) -> str | None:
    """The image types Go's http.DetectContentType finds (the ones DMR accepts)."""
    if head.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if head[:4] == b"RIFF" and head[8:14] == b"WEBPVP":
        return "image/webp"
    return None


def _is_image(head: bytes, path: str) -> bool:
    return sniff_image_type(head) is not None or path.lower().endswith(_IMAGE_SUFFIXES)


def include_files(prompt: str) -> str:
    """`@file` references replaced by the files' text (images left for `attach_images`)."""
    for match in _INCLUSION.finditer(prompt):
        written = next(group for group in match.groups() if group)
        path = normalize_path(written)
        try:
            content = Path(path).read_bytes()
        except OSError:
            continue  # not a file (an e-mail address, a handle): left as typed
        if _is_image(content[:512], path):
            continue
        text = content.decode("utf-8", "replace")
        for name in dict.fromkeys((written, path)):
            quoted = re.escape(name)
            reference = re.compile(f"@\"{quoted}\"|@'{quoted}'|@{quoted}(?=\\s|$)")
            prompt = reference.sub(lambda _, content=text: content, prompt)  # type: ignore[misc]
    return prompt


def image_data_uri(path: str) -> str:
    with open(path, "rb") as handle:
        head = handle.read(512)
        if not _is_image(head, path):
            raise PromptFileError(f"invalid image type for file: {path}")
        size = Path(path).stat().st_size
        if size > MAX_IMAGE_BYTES:
            raise PromptFileError(f"file size exceeds maximum limit ({MAX_IMAGE_BYTES // (1024 * 1024)} MB)")
        handle.seek(0)
        data = handle.read()
    kind = sniff_image_type(head) or _type_by_suffix(path)
    return f"data:{kind};base64,{base64.b64encode(data).decode()}"


def _type_by_suffix(path: str) -> str:
    suffix = path.lower().rsplit(".", 1)[-1]
    return {"jpg": "image/jpeg", "jpeg": "image/jpeg", "png": "image/png", "webp": "image/webp"}[suffix]


def attach_images(prompt: str) -> tuple[str, list[str]]:
    """Image paths found in the prompt: (the prompt without them, their data URIs). A path that does not
    exist is taken as plain text."""
    uris: list[str] = []
    for match in _IMAGE.finditer(prompt):
        written = match.group(1) or match.group(2) or match.group(0)
        path = normalize_path(written)
        try:
            uri = image_data_uri(path)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise PromptFileError(f"couldn't process image {path!r}: {exc.strerror or exc}") from None
        except PromptFileError as exc:
            raise PromptFileError(f"couldn't process image {path!r}: {exc}") from None
        for text in (f"'{path}'", f"'{written}'", path, written):
            prompt = prompt.replace(text, "")
        uris.append(uri)
    return prompt.strip(), uris


def user_message(prompt: str) -> dict[str, Any]:
    """The user message of a chat turn: files included, images attached first (as DMR orders them)."""
    text, images = attach_images(include_files(prompt))
    if not images:
        return {"role": "user", "content": text}
    parts: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": uri}} for uri in images]
    if text:
        parts.append({"type": "text", "text": text})
    return {"role": "user", "content": parts}
