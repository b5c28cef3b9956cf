"""Push one stored model to an OCI registry: blobs the registry lacks, then the manifest.

A blob the registry already has (HEAD) is skipped; one that another repository of the same registry holds
(known from our own tags) is mounted instead of uploaded. Uploads go in chunks and follow the offset the
registry reports in `Range`, not the one we think we sent: the test registry does not check
`Content-Range`, and after a network error the upload's status tells where to continue.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import httpx

from modelrunner.artifact.manifest import Descriptor
from modelrunner.distribution.errors import RegistryUnavailable, TransferCancelled
from modelrunner.distribution.progress import ProgressReporter
from modelrunner.distribution.registry import (
    MAX_ATTEMPTS,
    RegistryClient,
    backoff_seconds,
    describe,
    push_scope,
    raise_for_status,
)
from modelrunner.errors import InvalidReference
from modelrunner.reference import Reference, parse_reference
from modelrunner.store.store import ModelStore

log = logging.getLogger(__name__)

UPLOAD_CHUNK = 64 * 1024 * 1024
PARALLEL_BLOBS = 4
MAX_MOUNT_SOURCES = 3
_RANGE = re.compile(r"(?:bytes=)?(\d+)-(\d+)")


def reported_offset(response: httpx.Response) -> int | None:
    """The next byte the registry expects, from its `Range: 0-<last>` header (None when absent)."""
    match = _RANGE.fullmatch(response.headers.get("range", "").strip())
    return int(match.group(2)) + 1 if match else None


class RegistryPush:
    def __init__(
        self,
        store: ModelStore,
        source: str,
        target: Reference,
        reporter: ProgressReporter,
        cancelled: Callable[[], bool] = lambda: False,
        bearer_token: str | None = None,
    ) -> None:
        if target.tag is None:
            raise InvalidReference("push needs a tag, e.g. myorg/mymodel:latest")
        self.store = store
        self.model = store.get(source)
        self.target = target
        self.reporter = reporter
        self.cancelled = cancelled
        self.client = RegistryClient(target.registry, bearer_token=bearer_token, cancelled=cancelled)
        self.scopes = [push_scope(target.repository)]

    def prepare(self) -> None:
        """Check access before any byte moves, so that 401s become the HTTP status of the request."""
        self.client.blob_exists(self.target.repository, self.model.manifest.config.digest, self.scopes)

    def run(self) -> None:
        manifest = self.model.manifest
        try:
            blobs = list({b.digest: b for b in manifest.blobs}.values())
            # Progress covers the layers only, as DMR's; the config blob goes up silently.
            self.reporter.total = sum(layer.size for layer in manifest.layers)
            for layer in manifest.layers:
                self.reporter.add_layer(layer.digest, layer.size)
            with ThreadPoolExecutor(max_workers=PARALLEL_BLOBS, thread_name_prefix="push-blob") as pool:
                for future in [pool.submit(self._push_blob, blob) for blob in blobs]:
                    future.result()
            # Manifest last: the registry then never names a blob it does not have.
            assert self.target.tag is not None
            self.client.put_manifest(
                self.target.repository,
                self.target.tag,
                self.store.read_manifest(self.model.id),
                manifest.media_type,
            )
        finally:
            self.client.close()
        self.reporter.success("Model pushed successfully")

    def _mount_sources(self, digest: str) -> list[str]:
        """Other repositories of the target registry that hold this blob, as far as our tags tell."""
        sources: list[str] = []
        for model in self.store.list_models():
            if digest not in {b.digest for b in model.manifest.blobs}:
                continue
            for tag in model.tags:
                try:
                    ref = parse_reference(tag)
                except InvalidReference:
                    continue
                same_registry = ref.registry == self.target.registry
                if (
                    same_registry
                    and ref.repository != self.target.repository
                    and ref.repository not in sources
                ):
                    sources.append(ref.repository)
        return sources[:MAX_MOUNT_SOURCES]

    def _push_blob(self, blob: Descriptor) -> None:
        repository = self.target.repository
        if self.client.blob_exists(repository, blob.digest, self.scopes):
            self.reporter.layer_done(blob.digest)
            return
        location: str | None = None
        for source in self._mount_sources(blob.digest):
            location = self.client.mount_blob(repository, blob.digest, source)
            if location is None:
                log.info("mounted %s from %s", blob.digest[:19], source)
                self.reporter.layer_done(blob.digest)
                return
            break  # the registry opened a normal upload instead: use it
        self._upload(location or self.client.start_upload(repository), blob)
        self.reporter.layer_done(blob.digest)

    def _upload(self, location: str, blob: Descriptor) -> None:
        path = self.store.layout.blob_path(blob.digest)
        offset = 0
        failures = 0
        with open(path, "rb") as handle:
            while offset < blob.size:
                if self.cancelled():
                    raise TransferCancelled("the push was cancelled")
                length = min(UPLOAD_CHUNK, blob.size - offset)
                data = os.pread(handle.fileno(), length, offset)
                headers = {
                    "Content-Type": "application/octet-stream",
                    "Content-Range": f"{offset}-{offset + length - 1}",
                }
                try:
                    response = self.client.request(
                        "PATCH", location, self.scopes, headers=headers, content=data, retry=False
                    )
                    response.close()
                    if response.status_code in (502, 503, 504):
                        raise RegistryUnavailable(f"HTTP {response.status_code} during upload")
                    raise_for_status(response, f"upload of blob {blob.digest[:19]}")
                except (httpx.TransportError, RegistryUnavailable) as exc:
                    failures += 1
                    if failures >= MAX_ATTEMPTS:
                        raise RegistryUnavailable(
                            f"upload of blob {blob.digest[:19]} failed: {describe(exc)}"
                        ) from None
                    self.client.sleep(backoff_seconds(failures - 1))
                    location, offset = self._upload_status(location, offset)
                    continue
                location = self.client.http_location(response, location)
                reported = reported_offset(response)
                new_offset = reported if reported is not None else offset + length
                self.reporter.advance(blob.digest, new_offset - offset)
                offset = new_offset
        self.client.finish_upload(location, blob.digest, self.scopes)

    def _upload_status(self, location: str, offset: int) -> tuple[str, int]:
        """After an interrupted PATCH: ask the registry how much of the upload it kept."""
        try:
            response = self.client.request("GET", location, self.scopes)
            response.close()
        except (httpx.TransportError, RegistryUnavailable):
            return location, offset
        reported = reported_offset(response)
        if response.status_code != 204 or reported is None or reported <= 1:
            # Unknown, or `0-0`, which means either 0 or 1 byte: start a fresh upload to be sure.
            return self.client.start_upload(self.target.repository), 0
        return self.client.http_location(response, location), reported
