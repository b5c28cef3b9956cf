"""Model management routes (contract 2.2): list, inspect, rm, tag, repackage, load, export, package, purge."""

from __future__ import annotations

import contextlib
import ipaddress
import json
from pathlib import Path
from typing import Any, Literal

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator

from modelrunner.artifact.builder import (
    BuiltArtifact,
    PackageSpec,
    build_artifact,
    created_time,
    extend_artifact,
    local_zone,
)
from modelrunner.artifact.gojson import go_quote, parse_bool
from modelrunner.compat.bodies import json_body
from modelrunner.errors import BadRequest, NotFound, PermissionDenied
from modelrunner.reference import parse_reference
from modelrunner.server.body_stream import consume_in_thread
from modelrunner.server.localuser import caller_is_daemon_user
from modelrunner.server.ollama_persona import Personas
from modelrunner.signing.record import listed_with_verification, with_verification
from modelrunner.store.archive import export_chunks, load_archive
from modelrunner.store.sink import StoreSink
from modelrunner.store.store import ModelStore, full_tag


class RepackageRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    target: str = Field(min_length=1)
    context_size: int | None = Field(default=None, gt=0, le=2**31 - 1)


MAX_EPOCH = 253402300799  # 9999-12-31T23:59:59Z, the last second a config's `created` can say


class PackageRequest(BaseModel):
    """Our fast path for a local client: the daemon reads the files itself, hashing while copying."""

    model_config = ConfigDict(extra="forbid")
    target: str | None = None
    gguf: str | None = None
    safetensors_dir: str | None = None
    dduf: str | None = None
    from_model: str | None = Field(default=None, alias="from")
    licenses: list[str] = Field(default_factory=list, max_length=64)
    mmproj: str | None = None
    chat_template: str | None = None
    context_size: int | None = Field(default=None, gt=0, le=2**31 - 1)
    # None: Docker format for new files, the base model's format for `from` (DMR's builder.FromModel).
    format: Literal["docker", "cncf"] | None = None
    # What a build reads of its environment, the caller's (`model package` sends its own, as DMR's CLI
    # builds in its own process), so that the same files give the same model ID whatever the daemon's:
    # SOURCE_DATE_EPOCH (the config's `created`) and TZ (the zone of the layers' file times; one the
    # system does not know is UTC, as for Go). A variable left out is unset; without the field, the
    # daemon's own environment decides.
    environment: dict[str, str] | None = None

    @field_validator("environment")
    @classmethod
    def _build_variables(cls, environment: dict[str, str] | None) -> dict[str, str] | None:
        for name, value in (environment or {}).items():
            if name == "SOURCE_DATE_EPOCH":
                if value and not (value.isascii() and value.isdigit() and int(value) <= MAX_EPOCH):
                    raise ValueError(
                        f"SOURCE_DATE_EPOCH must be a number of seconds since 1970 up to {MAX_EPOCH}"
                    )
            elif name == "TZ":
                if len(value) > 4096 or any(ord(char) < 0x20 or ord(char) == 0x7F for char in value):
                    raise ValueError("TZ must be a time zone name or the path of a zone file")
            else:
                raise ValueError(f"{name[:64]!r} is not read by a build: only SOURCE_DATE_EPOCH and TZ")
        return environment


def _absolute(raw: str | None, what: str) -> Path | None:
    if raw is None:
        return None
    if "\0" in raw or not raw.startswith("/"):
        raise BadRequest(f"{what} must be an absolute path")
    return Path(raw)


def _is_loopback(request: Request) -> bool:
    host = request.client.host if request.client else ""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host in ("", "localhost")  # Unix sockets and in-process test clients have no address


def check_caller_may_read_files(request: Request, token: str) -> None:
    """Files named in a package request are read only for a local caller that is the daemon's own user."""
    if not _is_loopback(request):
        raise BadRequest("packaging from file paths is only allowed for clients on this machine")
    if not caller_is_daemon_user(request.scope, token):
        raise PermissionDenied(
            "the model runner reads files by path only for the user it runs as; as another user, "
            "`model package` uploads the files instead"
        )


def query_flag(request: Request, name: str) -> bool:
    """A flag in the query as DMR reads `force` and `remote` (`pkg/inference/models/http_handler.go`
    parseBoolQueryParam): absent is false, present without a value (`?force`) true, else ParseBool's
    answer, and false for what it refuses."""
    if name not in request.query_params:
        return False
    value = request.query_params[name]
    return value == "" or parse_bool(value) is True


def build_models_router(store: ModelStore, token: str) -> APIRouter:
    """`token`: the local token ($MODEL_RUNNER_HOME/daemon.token) proving a caller is the daemon's user."""
    router = APIRouter()

    @router.get("/models")
    def list_models() -> list[dict[str, Any]]:
        return listed_with_verification(store, store.list_models())

    @router.post("/models/load")
    async def load_model(request: Request) -> Response:
        model_id = await consume_in_thread(request.stream(), lambda reader: load_archive(store, reader))
        line = {"type": "success", "message": f"Model loaded successfully: {model_id}", "id": model_id}
        return Response(json.dumps(line) + "\n", media_type="application/x-ndjson")

    @router.post("/models/package", status_code=201)
    def package_model(
        request: Request, body: PackageRequest = Depends(json_body(PackageRequest))
    ) -> dict[str, Any]:
        check_caller_may_read_files(request, token)
        tags = [full_tag(body.target)] if body.target else []  # a bad tag fails before any work
        spec = PackageSpec(
            gguf=_absolute(body.gguf, "gguf"),
            safetensors_dir=_absolute(body.safetensors_dir, "safetensors_dir"),
            dduf=_absolute(body.dduf, "dduf"),
            licenses=[p for p in (_absolute(x, "license") for x in body.licenses) if p is not None],
            mmproj=_absolute(body.mmproj, "mmproj"),
            chat_template=_absolute(body.chat_template, "chat_template"),
            context_size=body.context_size,
            format=body.format,
        )
        environment = body.environment
        created = created_time(environment) if environment is not None else None
        zone = local_zone(environment.get("TZ")) if environment is not None else None
        sink = StoreSink(store)
        try:
            built: BuiltArtifact
            if body.from_model is not None:
                base = store.get(body.from_model)
                base_config = store.read_blob(base.manifest.config.digest)
                built = extend_artifact(base.manifest, base_config, spec, sink, file_time_zone=zone)
            else:
                built = build_artifact(spec, sink, created=created, file_time_zone=zone)
            model_id = store.add_model(built.manifest_bytes, tags)
        except BaseException:
            with contextlib.suppress(Exception):
                store.remove_unreferenced_blobs(sink.added)
            raise
        model = store.get(model_id)
        return {"message": "Model packaged successfully", "id": model_id, "tags": model.tags}

    @router.delete("/models/purge")
    def purge() -> Response:
        store.purge()
        return Response(status_code=200)  # DMR's handlePurge writes nothing

    @router.post("/models/{name:path}/tag", status_code=201)
    def tag_model(
        name: str, repo: str = Query(min_length=1), tag: str = Query(default="latest")
    ) -> dict[str, str]:
        target = f"{repo}:{tag}"
        store.tag(name, target)
        # as DMR's handleTagModel: the target as given, quoted as Go's %q quotes it
        return {"message": f"Model tagged successfully with {json.dumps(target)}", "target": target}

    @router.post("/models/{name:path}/repackage", status_code=201)
    def repackage_model(
        name: str, body: RepackageRequest = Depends(json_body(RepackageRequest))
    ) -> dict[str, str]:
        """http_handler.go handleRepackageModel: the names as the request gave them."""
        store.repackage(name, body.target, body.context_size)
        return {
            "message": f"Model repackaged successfully as {go_quote(body.target)}",
            "source": name,
            "target": body.target,
        }

    @router.get("/models/{name:path}/export")
    def export_model(name: str) -> StreamingResponse:
        store.get(name)  # a missing model is a 404 before the stream starts
        # as DMR's handleExportModel: `attachment; filename=%q` of the name as given plus ".tar"
        disposition = f"attachment; filename={json.dumps(name + '.tar')}"
        return StreamingResponse(
            export_chunks(store, name),
            media_type="application/x-tar",
            headers={"Content-Disposition": disposition},
        )

    @router.get("/models/{name:path}")
    def get_model(request: Request, name: str) -> dict[str, Any]:
        if query_flag(request, "remote"):  # read from the registry without pulling (`inspect --remote`)
            from modelrunner.distribution.inspect import inspect_remote

            return inspect_remote(parse_reference(name))
        return with_verification(store, store.get(name, by_name=True).to_api())

    @router.delete("/models/{name:path}")
    def delete_model(request: Request, name: str) -> list[dict[str, str]]:
        removed = store.delete(name, force=query_flag(request, "force"))
        personas = Personas(store)  # a name removed here loses what `/api/create` kept with it
        for tag in (entry["Untagged"] for entry in removed if "Untagged" in entry):
            personas.forget(tag)
        return removed

    @router.post("/models/{name:path}")
    def unknown_action(name: str) -> None:
        """DMR's handleModelAction: a POST under /models that names no action it knows is a 404."""
        action = name.rpartition("/")[2]
        raise NotFound(f"unknown action {json.dumps(action)}")

    return router
