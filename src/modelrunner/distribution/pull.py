"""Pull one model from an OCI registry into the store: manifest, config, then layers in parallel.

Each blob streams into `<hex>.incomplete`, hashed while written and verified before the rename (the store
does that). An interrupted blob resumes with `Range` from the partial's size; a server that ignores `Range`
restarts it from zero. Bad data (a digest mismatch, a malformed manifest) leaves the store as it was;
network errors and cancellations keep partial files so that the next pull fetches only what is missing.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait

import httpx

from modelrunner.artifact.manifest import Descriptor, Manifest, parse_manifest, sha256_digest
from modelrunner.artifact.model_config import parse_config_blob
from modelrunner.artifact.units import format_size
from modelrunner.distribution.errors import RegistryUnavailable, TransferCancelled
from modelrunner.distribution.progress import ProgressReporter
from modelrunner.distribution.registry import (
    MAX_ATTEMPTS,
    BlobResponse,
    RegistryClient,
    backoff_seconds,
    configured_mirrors,
    describe,
)
from modelrunner.errors import InvalidArtifact, ModelNotFound
from modelrunner.reference import Reference
from modelrunner.store.store import ModelStore

log = logging.getLogger(__name__)

PARALLEL_LAYERS = 4
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")


class RangeIgnored(Exception):
    """A 206 whose Content-Range does not start where we asked."""


def model_size_text(manifest: Manifest) -> str:
    return format_size(sum(layer.size for layer in manifest.layers))


class RegistryPull:
    """One pull. `resolve()` fetches and checks the manifest (errors there become HTTP statuses); `run()`
    transfers what is missing and registers the model."""

    def __init__(
        self,
        store: ModelStore,
        reference: Reference,
        reporter: ProgressReporter,
        cancelled: Callable[[], bool] = lambda: False,
        bearer_token: str | None = None,
    ) -> None:
        self.store = store
        self.reference = reference
        self.reporter = reporter
        self._job_cancelled = cancelled
        self._failed = threading.Event()
        self._bearer_token = bearer_token
        self.client: RegistryClient | None = None
        self.manifest_bytes = b""
        self.manifest: Manifest | None = None

    def cancelled(self) -> bool:
        return self._failed.is_set() or self._job_cancelled()

    def _clients(self) -> Iterator[RegistryClient]:
        """Mirrors first (MODEL_RUNNER_REGISTRY_MIRRORS), the registry itself last."""
        registry = self.reference.registry
        for url in configured_mirrors(registry):
            from urllib.parse import urlsplit

            yield RegistryClient(
                urlsplit(url).netloc, base_url=url, cancelled=self.cancelled, bearer_token=None
            )
        yield RegistryClient(registry, bearer_token=self._bearer_token, cancelled=self.cancelled)

    def resolve(self) -> Manifest:
        ref = self.reference
        wanted = ref.digest or ref.tag or "latest"
        last_error: Exception | None = None
        for client in self._clients():
            try:
                data, _ = client.get_manifest(ref.repository, wanted)
            except (RegistryUnavailable, ModelNotFound) as exc:
                client.close()
                last_error = exc
                if client.base_url != f"https://{client.registry}" and configured_mirrors(ref.registry):
                    log.info("mirror %s failed, trying the next source: %s", client.base_url, exc)
                continue
            except BaseException:
                client.close()
                raise
            self.client = client
            self.manifest_bytes = data
            break
        else:
            assert last_error is not None
            raise last_error
        if ref.digest and sha256_digest(self.manifest_bytes) != ref.digest:
            raise InvalidArtifact("the registry sent a manifest that does not match the requested digest")
        self.manifest = parse_manifest(self.manifest_bytes)
        return self.manifest

    def close(self) -> None:
        if self.client is not None:
            self.client.close()

    @property
    def model_id(self) -> str:
        return sha256_digest(self.manifest_bytes)

    def _tags(self) -> list[str]:
        return [str(self.reference)] if self.reference.tag else []

    def cached(self) -> bool:
        """The same model (same manifest digest) is already complete in the store: just (re)tag it."""
        assert self.manifest is not None
        if not all(self.store.has_blob(b.digest, b.size) for b in self.manifest.blobs):
            return False
        try:
            self.store.get(self.model_id)
        except ModelNotFound:
            return False
        self.store.add_model(self.manifest_bytes, self._tags())
        return True

    def run(self) -> str:
        manifest = self.manifest
        assert manifest is not None and self.client is not None
        if self.cached():
            self.reporter.success(f"Using cached model: {model_size_text(manifest)}")
            return self.model_id
        placed: list[str] = []
        try:
            if self._fetch_blob(manifest.config):
                placed.append(manifest.config.digest)
            parse_config_blob(self.store.read_blob(manifest.config.digest), manifest.config.media_type)
            self.reporter.total = sum(layer.size for layer in manifest.layers)
            for layer in manifest.layers:
                self.reporter.add_layer(layer.digest, layer.size)
            placed += self._fetch_layers(manifest.layers)
            model_id = self.store.add_model(self.manifest_bytes, self._tags())
        except InvalidArtifact:
            # Bad data: leave the store as it was (partials of the bad blob are already gone).
            self.store.remove_unreferenced_blobs(placed)
            raise
        self.reporter.success("Model pulled successfully")
        return model_id

    def _fetch_layers(self, layers: tuple[Descriptor, ...]) -> list[str]:
        unique = list({layer.digest: layer for layer in layers}.values())
        placed: list[str] = []
        with ThreadPoolExecutor(max_workers=PARALLEL_LAYERS, thread_name_prefix="pull-layer") as pool:
            futures = {pool.submit(self._fetch_blob, layer): layer for layer in unique}
            done, _ = wait(futures, return_when=FIRST_EXCEPTION)
            if any(f.exception() is not None for f in done):
                self._failed.set()  # stop the other layers; their partials stay for a resume
            wait(futures)
        errors = [f.exception() for f in futures if f.exception() is not None]
        placed = [futures[f].digest for f in futures if f.exception() is None and f.result()]
        if errors:
            first = next((e for e in errors if not isinstance(e, TransferCancelled)), errors[0])
            if isinstance(first, InvalidArtifact):
                self.store.remove_unreferenced_blobs(placed)
            assert first is not None
            raise first
        return placed

    def _fetch_blob(self, blob: Descriptor) -> bool:
        """Make sure the blob is in the store; True when this call placed it."""
        digest, size = blob.digest, blob.size
        if self.store.has_blob(digest, size):
            self.reporter.layer_done(digest)
            return False
        assert self.client is not None
        failures = 0
        while True:
            offset = self.store.partial_blob_size(digest)
            if offset > size:
                self.store.discard_partial_blob(digest)
                offset = 0
            if offset == size:  # complete but not yet verified (killed between write and rename)
                try:
                    self.store.resume_blob_stream(digest, size, size, [])
                    self.reporter.layer_done(digest)
                    return True
                except InvalidArtifact:
                    offset = 0  # the partial was bad and is gone; start over
            self.reporter.set_layer(digest, offset)
            try:
                response = self.client.open_blob(self.reference.repository, digest, offset)
                with contextlib.closing(response):
                    start = self._start_offset(response, offset)
                    if start != offset:
                        log.info("registry ignored Range for %s; restarting the blob", digest[:19])
                        self.reporter.set_layer(digest, start)
                    chunks = self._chunks(response, digest)
                    self.store.resume_blob_stream(digest, size, start, chunks)
                self.reporter.layer_done(digest)
                return True
            except RangeIgnored:
                self.store.discard_partial_blob(digest)
            except (httpx.TransportError, RegistryUnavailable) as exc:
                failures += 1
                if failures >= MAX_ATTEMPTS:
                    raise RegistryUnavailable(
                        f"download of blob {digest[:19]} failed {failures} times: {describe(exc)}; "
                        "pull again to resume"
                    ) from None
                log.info("blob %s interrupted (%s); resuming", digest[:19], describe(exc))
                self.client.sleep(backoff_seconds(failures - 1))

    @staticmethod
    def _start_offset(response: BlobResponse, offset: int) -> int:
        if response.status_code == 200:
            return 0
        match = _CONTENT_RANGE.fullmatch(response.headers.get("content-range", "").strip())
        if not match or int(match.group(1)) != offset:
            raise RangeIgnored()
        return offset

    def _chunks(self, response: BlobResponse, digest: str) -> Iterator[bytes]:
        for chunk in response.chunks():  # as the bytes arrive: a kill loses nothing read
            if self.cancelled():
                raise TransferCancelled("the pull was cancelled; pull again to resume")
            self.reporter.advance(digest, len(chunk))
            yield chunk
