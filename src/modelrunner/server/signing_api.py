"""`POST /models/{name}/verify`: a stored model checked offline against public keys (signing/local.py).
The keys come as PEM text in the body; the CLI reads the user's key files, the daemon reads the store."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends
from pydantic import BaseModel, ConfigDict, Field

from modelrunner.compat.bodies import json_body
from modelrunner.store.store import ModelStore

MAX_KEYS = 16


class VerifyRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    keys: list[str] = Field(min_length=1, max_length=MAX_KEYS)
    deep: bool = False


def build_signing_router(store: ModelStore) -> APIRouter:
    """Included before the models router, whose `POST /models/{name}` answers unknown actions."""
    router = APIRouter()

    @router.post("/models/{name:path}/verify")
    def verify_model(name: str, body: VerifyRequest = Depends(json_body(VerifyRequest))) -> dict[str, Any]:
        from modelrunner.signing.local import verify_stored

        return verify_stored(store, name, body.keys, body.deep)

    return router
