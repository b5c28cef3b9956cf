"""Ollama's model creation: `HEAD|POST /api/blobs/{digest}` and `POST /api/create` (`ollama create`, the
official clients' `create_blob` + `create`).

Uploaded files wait in the store's `downloads/` as `ollama-<hex>` (verified against their digest, removed
after 7 days if no model uses them). `create` makes a DMR artifact: from uploaded `files` (a GGUF, its
shards, or a safetensors folder) or `from` an existing model, plus `license` texts and `parameters.num_ctx`
as the context size; the uploaded files are moved into the blobs, not copied. The `system` prompt and the
other `parameters` (sampling defaults) are kept with the tag (server/ollama_persona.py) and applied by the
Ollama routes, as Ollama applies a Modelfile's SYSTEM and PARAMETER; a model created `from` one that has
them inherits them. What cannot be used is refused with a 400 that says so: Go chat templates, messages,
adapters, quantization, parameters that are not request options.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import IO, Any

from anyio import to_thread
from fastapi import APIRouter, Request, Response
from fastapi.responses import StreamingResponse
from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from modelrunner.artifact.builder import BuiltArtifact, PackageSpec, build_artifact, extend_artifact
from modelrunner.artifact.manifest import check_relative_path
from modelrunner.compat.bodies import parse_json_object, validated
from modelrunner.compat.ollama import stored_parameters
from modelrunner.digest import validate_digest
from modelrunner.errors import BadRequest
from modelrunner.fileio import link_or_copy
from modelrunner.server.body_stream import consume_in_thread
from modelrunner.server.ollama_persona import NONE, Persona, Personas
from modelrunner.server.routes import OLLAMA_PREFIX
from modelrunner.store.sink import AdoptingStoreSink
from modelrunner.store.store import ModelStore, full_tag

READ_SIZE = 1024 * 1024
MAX_LICENSE_TEXT = 1024 * 1024
_UNSUPPORTED = {
    "template": "Ollama (Go) chat templates cannot be used: the model's own template is used",
    "messages": "messages cannot be stored with the model: send them with each request",
    "adapters": "adapters (LoRA) are not supported",
    "quantize": "quantization is not supported: upload or pull the quantization you want",
    "modelfile": "Modelfiles are not supported: use `from`, `files`, `license` and `parameters`",
}


class CreateRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    model: str = Field(min_length=1, max_length=512, validation_alias=AliasChoices("model", "name"))
    from_: str | None = Field(default=None, alias="from", max_length=512)
    files: dict[str, str] | None = Field(default=None, max_length=1000)
    license: str | list[str] | None = None
    parameters: dict[str, Any] | None = None
    system: str | None = Field(default=None, max_length=1024 * 1024)
    stream: bool = True


def _upload_path(store: ModelStore, digest: str) -> Path:
    return store.layout.downloads_dir / ("ollama-" + validate_digest(digest).removeprefix("sha256:"))


def _receive_upload(store: ModelStore, digest: str, reader: IO[bytes]) -> None:
    """Write the body while hashing it; keep it only if it is what its digest says."""
    final = _upload_path(store, digest)
    final.parent.mkdir(parents=True, exist_ok=True)
    partial = final.with_name(f".{final.name}.{uuid.uuid4().hex}")
    hasher = hashlib.sha256()
    try:
        with open(partial, "wb") as handle:
            while block := reader.read(READ_SIZE):
                hasher.update(block)
                handle.write(block)
        if "sha256:" + hasher.hexdigest() != digest:
            raise BadRequest("the uploaded bytes do not match the digest in the URL")
        os.replace(partial, final)
    finally:
        partial.unlink(missing_ok=True)


def _stage_files(store: ModelStore, files: dict[str, str], folder: Path) -> dict[Path, str]:
    """Hard-link the named uploads (or blobs) into `folder` under their names; their digests by path."""
    digests: dict[Path, str] = {}
    for name, digest in files.items():
        check_relative_path(name, "file name")
        validate_digest(digest)
        source = _upload_path(store, digest)
        if not source.is_file():
            source = store.layout.blob_path(digest)
        if not source.is_file():
            raise BadRequest(f"no uploaded file {digest[:19]} for {name[:100]}: POST it to /api/blobs first")
        target = folder / name
        link_or_copy(source, target)  # uploads and blobs live in the store: a link, mostly
        digests[target.resolve()] = digest
    return digests


def _package_spec(body: CreateRequest, folder: Path) -> PackageSpec:
    spec = PackageSpec()
    names = sorted(body.files or {})
    if names:
        ggufs = [n for n in names if n.lower().endswith(".gguf")]
        if any(n.lower().endswith(".safetensors") for n in names):
            spec.safetensors_dir = folder
        elif ggufs:
            main = [n for n in ggufs if "mmproj" not in n.lower()]
            if not main:
                raise BadRequest("the files hold no model GGUF (only a projector)")
            spec.gguf = folder / main[0]  # shards are found from the first one
            projectors = [n for n in ggufs if "mmproj" in n.lower()]
            spec.mmproj = folder / projectors[0] if projectors else None
        else:
            raise BadRequest("the files hold no model: give a .gguf file or a safetensors folder")
    texts = [body.license] if isinstance(body.license, str) else list(body.license or [])
    for index, text in enumerate(texts):
        if len(text.encode()) > MAX_LICENSE_TEXT:
            raise BadRequest("a license text is larger than 1 MiB")
        path = folder.parent / "licenses" / f"LICENSE-{index + 1}.txt"
        path.parent.mkdir(exist_ok=True)
        path.write_text(text, encoding="utf-8")
        spec.licenses.append(path)
    value = (body.parameters or {}).get("num_ctx")
    if value is not None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise BadRequest("num_ctx must be a positive number of tokens")
        spec.context_size = value
    return spec


def _persona(store: ModelStore, body: CreateRequest) -> Persona:
    """The new model's system prompt and parameters (its ID yet to come): the request's, over those of the
    model it is from."""
    base = NONE
    if body.from_ is not None:
        base = Personas(store).of(body.from_, store.get(body.from_))
    parameters = {**base.parameters, **stored_parameters(body.parameters or {})}
    return Persona("", body.system or base.system, parameters)


def create_model(store: ModelStore, body: CreateRequest, raw: dict[str, Any]) -> str:
    """Build and tag the model; nothing is kept of a failed build."""
    for field, why in _UNSUPPORTED.items():
        if raw.get(field) not in (None, "", [], {}):
            raise BadRequest(f"{field}: {why}")
    if (body.from_ is None) == (not body.files):
        raise BadRequest("give either `from` (a model) or `files` (uploaded with /api/blobs)")
    tag = full_tag(body.model)
    persona = _persona(store, body)  # a parameter that cannot be kept fails before any work
    work = Path(tempfile.mkdtemp(prefix=".create-", dir=store.layout.downloads_dir))
    try:
        folder = work / "model"
        folder.mkdir()
        digests = _stage_files(store, body.files or {}, folder)
        spec = _package_spec(body, folder)
        sink = AdoptingStoreSink(store, digests)  # the staged links move into the blobs
        try:
            built: BuiltArtifact
            if body.from_ is not None:
                base = store.get(body.from_)
                config = store.read_blob(base.manifest.config.digest)
                built = extend_artifact(base.manifest, config, spec, sink)
            else:
                built = build_artifact(spec, sink)
            model_id = store.add_model(built.manifest_bytes, [tag])
            Personas(store).put(tag, replace(persona, model_id=model_id))
        except BaseException:
            with contextlib.suppress(Exception):
                store.remove_unreferenced_blobs(sink.added)
            raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for digest in (body.files or {}).values():  # now a blob: the upload is not needed any more
        _upload_path(store, digest).unlink(missing_ok=True)
    return model_id


def build_ollama_create_router(store: ModelStore) -> APIRouter:
    router = APIRouter(prefix=OLLAMA_PREFIX)  # errors in Ollama's shape: the route table says its family

    @router.head("/blobs/{digest}")
    def blob_exists(digest: str) -> Response:
        found = _upload_path(store, digest).is_file() or store.has_blob(digest)
        return Response(status_code=200 if found else 404)

    @router.post("/blobs/{digest}", status_code=201)
    async def upload_blob(digest: str, request: Request) -> Response:
        validate_digest(digest)
        store.layout.downloads_dir.mkdir(exist_ok=True)
        await consume_in_thread(request.stream(), lambda reader: _receive_upload(store, digest, reader))
        return Response(status_code=201)

    @router.post("/create")
    async def create(request: Request) -> Response:
        raw = parse_json_object(await request.body())
        body = validated(CreateRequest, raw)
        store.layout.downloads_dir.mkdir(exist_ok=True)
        # the work is done before the answer starts: an error is an HTTP status, as Ollama's clients expect
        await to_thread.run_sync(create_model, store, body, raw)
        statuses = ["creating model", "writing manifest", "success"]
        if not body.stream:
            return Response(json.dumps({"status": "success"}), media_type="application/json")

        async def lines() -> AsyncIterator[bytes]:
            for status in statuses:
                yield (json.dumps({"status": status}) + "\n").encode()

        return StreamingResponse(lines(), media_type="application/x-ndjson")

    return router
