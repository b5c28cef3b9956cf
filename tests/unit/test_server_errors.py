"""server/errors.py: failures that are not a ModelRunnerError are answered in the API's shape (DMR's
routes: http.Error's text, the message and a newline; Ollama's: its JSON), never as Starlette's bare text
500: a full disk is a 507, anything else a 500 whose traceback is only in the log."""

from __future__ import annotations

import asyncio
import errno
import logging

import httpx
import pytest
from fastapi import APIRouter, FastAPI

from modelrunner.errors import BadRequest
from modelrunner.server.errors import install_error_handlers


def app() -> FastAPI:
    api = FastAPI()
    install_error_handlers(api)
    shaped = APIRouter(prefix="/api")  # Ollama's routes: its error shape, chosen by the path

    def full() -> None:
        raise OSError(errno.ENOSPC, "No space left on device", "/secret/store/blobs/x")

    def broken() -> None:
        raise RuntimeError("a bug with /secret/path in its text")

    def bad() -> None:
        raise BadRequest("bad input")

    for router in (api.router, shaped):
        router.add_api_route("/full", full, methods=["POST"])
        router.add_api_route("/broken", broken, methods=["POST"])
        router.add_api_route("/bad", bad, methods=["POST"])
    api.include_router(shaped)
    return api


def post(path: str) -> httpx.Response:
    async def send() -> httpx.Response:
        transport = httpx.ASGITransport(app=app(), raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await client.post(path)

    return asyncio.run(send())


@pytest.mark.parametrize("prefix", ["", "/api"])
def test_a_full_disk_is_a_507(prefix: str, caplog: pytest.LogCaptureFixture) -> None:
    response = post(prefix + "/full")
    assert response.status_code == 507
    message = response.json()["error"] if prefix else response.text
    assert message.startswith("no space left on device") and "/secret" not in message
    if not prefix:
        assert response.headers["content-type"] == "text/plain; charset=utf-8" and message.endswith("\n")
    assert any(
        r.msg == "storage_full" and vars(r)["fields"]["path"] == prefix + "/full" for r in caplog.records
    )


@pytest.mark.parametrize("prefix", ["", "/api"])
def test_an_unexpected_exception_is_a_json_500_with_the_traceback_in_the_log(
    prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR):
        response = post(prefix + "/broken")
    assert response.status_code == 500
    message = response.json()["error"] if prefix else response.text
    assert "RuntimeError" in message and "model logs" in message
    assert "/secret" not in response.text and "Traceback" not in response.text
    [record] = [r for r in caplog.records if r.msg == "internal_error"]
    assert record.exc_info is not None and vars(record)["fields"]["path"] == prefix + "/broken"


@pytest.mark.parametrize("prefix", ["", "/api"])
def test_model_runner_errors_keep_their_status(prefix: str) -> None:
    response = post(prefix + "/bad")
    assert response.status_code == 400
    assert "bad input" in response.text
