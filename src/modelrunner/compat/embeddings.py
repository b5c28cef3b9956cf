"""Embedding vectors as the APIs promise them, whatever the engine sent.

`dimensions` (OpenAI's and Ollama's) keeps a vector's first values and L2-normalises them again, as
Matryoshka-trained models are meant to be shortened: engines ignore it (llama-server) or refuse it for
most models (vLLM), so the daemon asks them for the whole vector and shortens it. OpenAI's
`encoding_format: "base64"` is the vector's little-endian float32 bytes, base64-encoded.
"""

from __future__ import annotations

import base64
import json
import math
import struct
from dataclasses import dataclass
from typing import Any

from modelrunner.errors import BadRequest

ENCODINGS = ("float", "base64")


def normalised(vector: list[float]) -> list[float]:
    """The vector scaled to unit L2 length (a zero vector stays zero), as Ollama's `normalize`."""
    scale = 1.0 / max(math.sqrt(math.fsum(v * v for v in vector)), 1e-12)
    return [v * scale for v in vector]


def shortened(vector: list[float], dimensions: int) -> list[float]:
    """The first `dimensions` values normalised again; a vector no longer than that is left alone."""
    return normalised(vector[:dimensions]) if dimensions < len(vector) else vector


def encoded(vector: list[float]) -> str:
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()


@dataclass(frozen=True)
class Shortening:
    """What an OpenAI embeddings request asked of the vectors the engine computes in full, as floats."""

    dimensions: int
    base64: bool

    @classmethod
    def of(cls, doc: dict[str, Any]) -> Shortening | None:
        """The request's `dimensions` checked as OpenAI checks it (its words, `param`); None if absent."""
        value = doc.get("dimensions")
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise BadRequest(
                f"Invalid type for 'dimensions': expected an integer, but got {_json_type(value)} instead.",
                param="dimensions",
            )
        if value < 1:
            raise BadRequest(
                f"Invalid 'dimensions': integer below minimum value. Expected a value >= 1, but got {value} "
                "instead.",
                param="dimensions",
            )
        encoding = doc.get("encoding_format", "float")
        if encoding not in ENCODINGS:
            raise BadRequest(
                f"Invalid value for 'encoding_format': {str(encoding)[:40]!r}. Supported values are: "
                "'float' and 'base64'.",
                param="encoding_format",
            )
        return cls(value, encoding == "base64")

    @staticmethod
    def engine_request(doc: dict[str, Any]) -> dict[str, Any]:
        """The request the engine gets: whole vectors, as floats."""
        return {k: v for k, v in doc.items() if k not in ("dimensions", "encoding_format")}

    def answer(self, doc: dict[str, Any]) -> dict[str, Any]:
        """The engine's answer with each vector shortened (and encoded); a `dimensions` beyond the model's
        size is the client's error, known once the engine said how long its vectors are."""
        data = doc.get("data")
        if not isinstance(data, list):
            return doc
        items = []
        for item in data:
            vector = item.get("embedding") if isinstance(item, dict) else None
            if not isinstance(vector, list):
                items.append(item)
                continue
            if self.dimensions > len(vector):
                raise BadRequest(
                    f"Invalid 'dimensions': integer above maximum value. Expected a value <= {len(vector)} "
                    f"(the model's embedding size), but got {self.dimensions} instead.",
                    param="dimensions",
                )
            short = shortened(vector, self.dimensions)
            items.append({**item, "embedding": encoded(short) if self.base64 else short})
        return {**doc, "data": items}

    def answer_bytes(self, body: bytes) -> bytes:
        try:
            doc = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            return body  # not an answer to shorten: the client gets what the engine said
        if not isinstance(doc, dict):
            return body
        return json.dumps(self.answer(doc), separators=(",", ":")).encode()


def _json_type(value: object) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, float):
        return "a decimal"
    if isinstance(value, list):
        return "an array"
    return "an object" if isinstance(value, dict) else "a value"
