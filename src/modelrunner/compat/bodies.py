"""Request bodies of the JSON APIs: parsed, then checked against a pydantic shape, with a 400 that says
what is wrong instead of a 500.

Bodies are read as JSON whatever their Content-Type, as DMR reads them: its README's `curl -d '{...}'` and
its Helm chart's pre-pull init container send `application/x-www-form-urlencoded`. That opens no door to
web pages: a browser's cross-origin "simple request" (form-encoded or text/plain, sent without a preflight)
carries an `Origin` header, and the security middleware refuses every origin that is not allowed before
any route runs.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import Request

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


def json_body(shape: type[Shape]) -> Callable[[Request], Awaitable[Shape]]:
    """A FastAPI dependency (`body: X = Depends(json_body(X))`): the request body as `shape`, read as JSON
    whatever its Content-Type."""

    async def read(request: Request) -> Shape:
        return validated(shape, parse_json_object(await request.body()))

    return read
