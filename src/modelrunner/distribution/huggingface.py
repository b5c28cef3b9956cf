"""Pull `hf.co/org/repo[:QUANT]` from the Hugging Face Hub's native API and build the artifact locally.

The file list and repository info come through huggingface_hub (`HF_ENDPOINT`, `HF_TOKEN` honoured); files
of the repository's current commit (pinned, so a push during the pull cannot mix versions) download 4 at a
time into the store's `downloads/` folder, with progress, retries and HTTP `Range` resume: an interrupted
or cancelled pull leaves its partial files, and the next pull of the same model fetches only what is
missing. Large (LFS) files are checked against the sha256 the Hub lists, hashed as they arrive. Then
`build_artifact` makes a v0.1 (GGUF) or v0.2 (safetensors) artifact, moving the files into the blobs with
the digests already computed: no second copy on disk, no second read. File times and `created` are the
repository's lastModified, so the same repository gives the same model ID on every machine.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, urljoin, urlsplit

import httpx
from filelock import FileLock, Timeout

from modelrunner.artifact.builder import MAX_CHAT_TEMPLATE_BYTES, PackageSpec, build_artifact
from modelrunner.artifact.manifest import check_relative_path
from modelrunner.artifact.units import format_size
from modelrunner.distribution import netpolicy
from modelrunner.distribution.errors import (
    RegistryUnauthorized,
    RegistryUnavailable,
    TransferCancelled,
    unreachable,
)
from modelrunner.distribution.hf_select import Selection, select_files
from modelrunner.distribution.progress import ProgressReporter
from modelrunner.distribution.registry import (
    MAX_ATTEMPTS,
    USER_AGENT,
    backoff_seconds,
    cancellable_sleep,
    describe,
    stall_timeout,
)
from modelrunner.errors import Conflict, InvalidArtifact, ModelNotFound, ModelRunnerError
from modelrunner.reference import Reference
from modelrunner.store.sink import AdoptingStoreSink
from modelrunner.store.store import ModelStore

PARALLEL_FILES = 4
MAX_REDIRECTS = 5
HASH_BLOCK = 1024 * 1024
_CONTENT_RANGE = re.compile(r"bytes (\d+)-\d+/(?:\d+|\*)")

log = logging.getLogger(__name__)


class _Retry(Exception):
    """A download attempt that failed in a way worth retrying (network, 429/5xx, cut short)."""


class _RangeRefused(_Retry):
    """The partial file cannot be continued: the next attempt starts the file over."""


def hub_endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")


def _hub_error(exc: Exception, repo: str) -> ModelRunnerError:
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError

    if isinstance(exc, GatedRepoError):
        return RegistryUnauthorized(f"hf.co/{repo} is gated: accept its terms on the Hub and set HF_TOKEN")
    if isinstance(exc, RepositoryNotFoundError):
        return ModelNotFound(f"hf.co/{repo} not found (or private: set HF_TOKEN to a token that can read it)")
    if isinstance(exc, HfHubHTTPError):
        status = exc.response.status_code if exc.response is not None else 0
        if status in (401, 403):
            return RegistryUnauthorized(f"access to hf.co/{repo} was refused; check HF_TOKEN")
        if status == 404:
            return ModelNotFound(f"hf.co/{repo} not found")
        return RegistryUnavailable(f"the Hugging Face Hub answered HTTP {status} for {repo}")
    return unreachable("the Hugging Face Hub", exc)


class HuggingFacePull:
    def __init__(
        self,
        store: ModelStore,
        reference: Reference,
        reporter: ProgressReporter,
        cancelled: Callable[[], bool] = lambda: False,
        token: str | None = None,
    ) -> None:
        self.store = store
        self.reference = reference
        self.repo = reference.original_repository  # the Hub is case-sensitive
        self.reporter = reporter
        self.cancelled = cancelled
        self.token = token or os.environ.get("HF_TOKEN") or None
        self.endpoint = hub_endpoint()
        self.selection: Selection | None = None
        self.sizes: dict[str, int] = {}
        self.sha256: dict[str, str] = {}  # of the LFS files, as the Hub lists them
        self.digests: dict[Path, str] = {}  # of the files this pull downloaded, by resolved path
        self.revision = "main"
        self.last_modified: datetime | None = None

    def resolve(self) -> Selection:
        from huggingface_hub import HfApi
        from huggingface_hub.hf_api import RepoFile

        self.reporter.status("Fetching file list...")
        api = HfApi(endpoint=self.endpoint, token=self.token or False, user_agent=USER_AGENT)
        try:
            info = api.model_info(self.repo)
            self.revision = info.sha or "main"
            tree = api.list_repo_tree(self.repo, recursive=True, revision=self.revision)
            entries = [e for e in tree if isinstance(e, RepoFile)]
        except Exception as exc:
            raise _hub_error(exc, self.repo) from None
        self.last_modified = info.last_modified
        self.sizes = {e.path: int(e.size) for e in entries}
        self.sha256 = {e.path: e.lfs.sha256 for e in entries if e.lfs is not None and e.lfs.sha256}
        selection = select_files(sorted(self.sizes), self.reference.tag, self.repo)
        for path in selection.all_files:
            check_relative_path(path, "Hugging Face file")
        if selection.kind == "gguf":
            how = " (default)" if selection.default_used else ""
            self.reporter.status(f"Selected {selection.quantization or 'GGUF'} quantization{how}")
        total = sum(self.sizes[p] for p in selection.all_files)
        self.reporter.status(f"Found {len(selection.all_files)} files ({format_size(total)} total)")
        self.selection = selection
        return selection

    def _cached(self) -> bool:
        try:
            model = self.store.get(str(self.reference))
        except ModelNotFound:
            return False
        size = model.config.config.get("size", "")
        self.reporter.success(f"Using cached model: {size}")
        return True

    def run(self) -> str:
        selection = self.selection
        assert selection is not None
        if self._cached():
            return self.store.get(str(self.reference)).id
        folder = self._download_folder()
        folder.mkdir(parents=True, exist_ok=True)
        try:
            with FileLock(str(folder) + ".lock", timeout=0):
                self._download_all(selection.all_files, folder)  # on failure the files stay, to resume
                self.reporter.status("Building model artifact...")
                try:
                    model_id = self._build(selection, folder)
                finally:
                    shutil.rmtree(folder, ignore_errors=True)  # built, or not a model: not worth keeping
                    Path(str(folder) + ".lock").unlink(missing_ok=True)
        except Timeout:
            raise Conflict(f"hf.co/{self.repo} is being pulled by another process") from None
        self.reporter.success("Model pulled successfully")
        return model_id

    def _download_folder(self) -> Path:
        """Where this model's files gather: one folder per endpoint, repository, commit and tag."""
        key = "\n".join((self.endpoint, self.repo, self.revision, self.reference.tag or ""))
        return self.store.layout.downloads_dir / ("hf-" + hashlib.sha256(key.encode()).hexdigest()[:32])

    def _build(self, selection: Selection, folder: Path) -> str:
        created = self.last_modified or datetime.fromtimestamp(0, UTC)
        if selection.kind == "gguf":
            spec = PackageSpec(
                gguf=folder / selection.files[0],
                mmproj=folder / selection.mmproj if selection.mmproj else None,
                chat_template=self._template_file(folder, selection.chat_template),
            )
        else:
            spec = PackageSpec(safetensors_dir=folder)
        stamp = created.timestamp()
        for path in folder.rglob("*"):  # layer annotations carry mode and mtime: keep the ID deterministic
            if path.is_file():
                os.chmod(path, 0o644)
            os.utime(path, (stamp, stamp))
        sink = AdoptingStoreSink(self.store, self.digests)  # moved, not copied: one copy on disk
        try:
            built = build_artifact(spec, sink, created=created, file_time_zone=UTC)
            return self.store.add_model(built.manifest_bytes, [str(self.reference)])
        except BaseException:
            with contextlib.suppress(Exception):
                self.store.remove_unreferenced_blobs(sink.added)
            raise

    @staticmethod
    def _template_file(folder: Path, path: str | None) -> Path | None:
        if path is None:
            return None
        source = folder / path
        if source.name != "tokenizer_config.json":
            return source
        try:
            doc: Any = json.loads(source.read_bytes()[: MAX_CHAT_TEMPLATE_BYTES * 4])
        except ValueError:
            return None
        template = doc.get("chat_template") if isinstance(doc, dict) else None
        if not isinstance(template, str) or not template:
            return None  # absent, or a list of named templates: the GGUF's own template is used
        target = folder / ".template" / "template.jinja"
        target.parent.mkdir(exist_ok=True)
        target.write_text(template, encoding="utf-8")
        return target

    def _download_all(self, paths: list[str], folder: Path) -> None:
        self.reporter.total = sum(self.sizes[p] for p in paths)
        for path in paths:
            self.reporter.add_layer(path, self.sizes[path])
        headers = {"User-Agent": USER_AGENT}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        timeout = httpx.Timeout(connect=30.0, read=stall_timeout(), write=60.0, pool=60.0)
        with (
            httpx.Client(timeout=timeout, headers=headers, follow_redirects=False) as http,
            ThreadPoolExecutor(max_workers=PARALLEL_FILES, thread_name_prefix="hf-file") as pool,
        ):
            for future in [pool.submit(self._download, http, p, folder) for p in paths]:
                future.result()

    def _download(self, http: httpx.Client, path: str, folder: Path) -> None:
        """One file into `<path>.incomplete`, resumed from its size after an interruption, then renamed."""
        target = folder / path
        partial = target.with_name(target.name + ".incomplete")
        expected = self.sizes[path]
        if target.is_file() and target.stat().st_size == expected:
            self.reporter.layer_done(path)  # complete and checked by an earlier pull
            return
        target.parent.mkdir(parents=True, exist_ok=True)
        failures = 0
        while True:
            try:
                digest = self._fetch(http, path, partial, expected)
                break
            except _Retry as exc:
                failures += 1
                if failures >= MAX_ATTEMPTS:
                    raise RegistryUnavailable(
                        f"download of {path} failed {failures} times: {exc}; pull again to resume"
                    ) from None
                log.info("download of %s interrupted (%s); resuming", path, exc)
                cancellable_sleep(backoff_seconds(failures - 1), self.cancelled)
        os.replace(partial, target)
        self.digests[target.resolve()] = "sha256:" + digest
        self.reporter.layer_done(path)

    def _fetch(self, http: httpx.Client, path: str, partial: Path, expected: int) -> str:
        """One attempt: continue `partial` from its size (from 0 if the server ignores `Range`), then check
        the whole file's size and, when the Hub lists one, its sha256; the file's sha256 (hex)."""
        offset = partial.stat().st_size if partial.exists() else 0
        if offset > expected:
            offset = 0
        self.reporter.set_layer(path, offset)
        try:
            response = self._open(http, path, offset)
            with contextlib.closing(response):
                start = _start_offset(response, offset)
                if start != offset:
                    log.info("the Hub ignored Range for %s; restarting the file", path)
                    self.reporter.set_layer(path, start)
                digest = self._receive(response, path, partial, start, expected)
        except _RangeRefused:
            partial.unlink(missing_ok=True)
            raise
        except httpx.TransportError as exc:
            raise _Retry(describe(exc)) from None
        wanted = self.sha256.get(path)
        if wanted and digest.hexdigest() != wanted.lower():
            partial.unlink()
            raise InvalidArtifact(f"{path} does not match the sha256 the Hub lists for it; pull again")
        return digest.hexdigest()

    def _receive(
        self, response: httpx.Response, path: str, partial: Path, start: int, expected: int
    ) -> hashlib._Hash:
        """Write the body into `partial` from `start`, hashing the file as it grows; the file's sha256."""
        digest = _hash_prefix(partial, start)
        written = start
        with open(partial, "r+b" if start else "wb") as handle:
            handle.truncate(start)
            handle.seek(start)
            for chunk in response.iter_bytes():  # written as it arrives: an interruption loses nothing read
                if self.cancelled():
                    raise TransferCancelled("the pull was cancelled; pull again to resume")
                written += len(chunk)
                if written > expected:
                    handle.truncate(0)
                    raise RegistryUnavailable(f"{path} is larger than the Hub said")
                handle.write(chunk)
                digest.update(chunk)
                self.reporter.advance(path, len(chunk))
        if written != expected:
            raise _Retry(f"the Hub sent {written} of {expected} bytes")
        return digest

    def _open(self, http: httpx.Client, path: str, offset: int) -> httpx.Response:
        """The file's streamed response, redirects followed (the token stays with the Hub)."""
        url = f"{self.endpoint}/{self.repo}/resolve/{quote(self.revision)}/{quote(path)}"
        endpoint_host = urlsplit(self.endpoint).netloc
        for _ in range(MAX_REDIRECTS):
            request = http.build_request("GET", url)
            if offset:
                request.headers["Range"] = f"bytes={offset}-"
            if urlsplit(url).netloc != endpoint_host:
                request.headers.pop("Authorization", None)
            response = http.send(request, stream=True)
            if response.status_code not in (301, 302, 303, 307, 308):
                break
            response.close()
            url = urljoin(url, response.headers.get("location", ""))
            netpolicy.check_target(url, endpoint_host, "redirect")
        else:
            raise RegistryUnavailable(f"too many redirects for {path}")
        status = response.status_code
        if status < 400:
            return response
        response.close()
        if status in (401, 403):
            raise RegistryUnauthorized(f"access to hf.co/{self.repo} was refused; check HF_TOKEN")
        if status == 429 or status >= 500:
            raise _Retry(f"HTTP {status}")
        if status == 416:
            raise _RangeRefused(f"the Hub refused the range of {path}")
        raise RegistryUnavailable(f"the Hub answered HTTP {status} for {path}")


def _start_offset(response: httpx.Response, offset: int) -> int:
    """Where the response's bytes start: `offset` for a matching 206, 0 for a 200."""
    if response.status_code != 206:
        return 0
    match = _CONTENT_RANGE.fullmatch(response.headers.get("content-range", "").strip())
    if not match or int(match.group(1)) != offset:
        raise _RangeRefused("the Hub answered a different range than asked")
    return offset


def _hash_prefix(path: Path, size: int) -> hashlib._Hash:
    """sha256 over the first `size` bytes already on disk (a resumed file is checked whole)."""
    digest = hashlib.sha256()
    if size:
        with open(path, "rb") as handle:
            remaining = size
            while remaining and (block := handle.read(min(HASH_BLOCK, remaining))):
                digest.update(block)
                remaining -= len(block)
    return digest
