"""Pull and push routes (contract 2.2, 2.3): `POST /models/create`, `POST /models/{name}/push`.

Errors found before the transfer starts (bad reference, 401, 404, 422) are HTTP statuses; after that the
stream carries `{"type":"error"}` lines. The stream is `application/json` when the client asks for it, else
`text/plain` with HTML-escaped JSON lines, as DMR sends it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio.to_thread
from fastapi import APIRouter, Depends, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from modelrunner.compat.bodies import json_body, parse_json_object, validated
from modelrunner.distribution.progress import encode_line
from modelrunner.server.transfers import TransferJob, TransferManager
from modelrunner.store.store import ModelStore


class CreateRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    source: str = Field(alias="from", min_length=1, max_length=4096)
    bearer_token: str | None = Field(default=None, alias="bearer-token", max_length=16384)


class PushRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    bearer_token: str | None = Field(default=None, alias="bearer-token", max_length=16384)


# The progress of a fast pull comes as ~1,000 events a second (one per layer and MiB, as DMR throttles
# them: distribution/progress.py); waking the event loop for each took a quarter of the daemon's CPU in a
# 1 GiB pull from a local registry. The stream takes what gathered, at most this often: every event is
# still sent, in fewer writes.
STREAM_GATHER_SECONDS = 0.02


async def _stream(job: TransferJob, html_escape: bool) -> AsyncIterator[bytes]:
    index = 0
    try:
        while True:
            events, finished = await anyio.to_thread.run_sync(job.next_events, index, 0.5)
            index += len(events)
            if events:
                yield b"".join(encode_line(item, html_escape) for item in events)
            if finished:
                return
            if events:
                await anyio.sleep(STREAM_GATHER_SECONDS)
    finally:
        job.detach()


async def wait_started(job: TransferJob) -> None:
    """Wait until the job runs (or has failed at once): a failure detaches from the job and is raised, so it
    becomes an HTTP status before any progress is streamed."""
    try:
        error = await anyio.to_thread.run_sync(job.wait_resolved)
    except BaseException:
        job.detach()
        raise
    if error is not None:
        job.detach()
        raise error


async def _respond(job: TransferJob, request: Request) -> StreamingResponse:
    await wait_started(job)
    as_json = "application/json" in request.headers.get("accept", "")
    return StreamingResponse(
        _stream(job, html_escape=not as_json),
        media_type="application/json" if as_json else "text/plain; charset=utf-8",
        headers={"Cache-Control": "no-cache"},
    )


def build_distribution_router(store: ModelStore, transfers: TransferManager) -> APIRouter:
    router = APIRouter()

    @router.post("/models/create")
    async def create_model(
        request: Request, body: CreateRequest = Depends(json_body(CreateRequest))
    ) -> StreamingResponse:
        job = await anyio.to_thread.run_sync(transfers.start_pull, body.source, body.bearer_token)
        return await _respond(job, request)

    @router.post("/models/{name:path}/push")
    async def push_model(name: str, request: Request) -> StreamingResponse:
        raw = await request.body()
        body = validated(PushRequest, parse_json_object(raw)) if raw.strip() else PushRequest()
        job = await anyio.to_thread.run_sync(transfers.start_push, name, body.bearer_token)
        return await _respond(job, request)

    return router
