"""Request bodies of the JSON APIs: parsed, then checked against a pydantic shape, with a 400 that says
what is wrong instead of a 500."""

from __future__ import annotations

import json
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from modelrunner.errors import BadRequest

Shape = TypeVar("Shape", bound=BaseModel)


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """A request body that must be a JSON object."""
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: nested too deeply
        raise BadRequest("the request body is not valid JSON") from None
    if not isinstance(doc, dict):
        raise BadRequest("the request body must be a JSON object")
    return doc


def validated(shape: type[Shape], doc: dict[str, Any], prefix: str = "invalid request: ") -> Shape:
    """`doc` as `shape`; BadRequest naming the first field that does not fit."""
    try:
        return shape.model_validate(doc)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise BadRequest(f"{prefix}{where}: {first.get('msg', 'invalid')}") from None
