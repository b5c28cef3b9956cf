"""Pull `hf.co/org/repo[:QUANT]` from the Hugging Face Hub's native API and build the artifact locally.

The file list and repository info come through huggingface_hub (`HF_ENDPOINT`, `HF_TOKEN` honoured); files
download 4 at a time into a temporary folder with progress, then `build_artifact` makes a v0.1 (GGUF) or
v0.2 (safetensors) artifact. File times and `created` are the repository's lastModified, so the same
repository gives the same model ID on every machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, urljoin, urlsplit

import httpx

from modelrunner.artifact.builder import MAX_CHAT_TEMPLATE_BYTES, PackageSpec, build_artifact
from modelrunner.artifact.manifest import check_relative_path
from modelrunner.artifact.units import format_size
from modelrunner.distribution import netpolicy
from modelrunner.distribution.errors import RegistryUnauthorized, RegistryUnavailable, TransferCancelled
from modelrunner.distribution.hf_select import Selection, select_files
from modelrunner.distribution.progress import ProgressReporter
from modelrunner.distribution.registry import USER_AGENT, stall_timeout
from modelrunner.errors import ModelNotFound, ModelRunnerError
from modelrunner.reference import Reference
from modelrunner.store.sink import StoreSink
from modelrunner.store.store import ModelStore

PARALLEL_FILES = 4
MAX_REDIRECTS = 5


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
    return RegistryUnavailable(f"cannot reach the Hugging Face Hub: {str(exc)[:200]}")


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
        self.last_modified: datetime | None = None

    def resolve(self) -> Selection:
        from huggingface_hub import HfApi
        from huggingface_hub.hf_api import RepoFile

        self.reporter.status("Fetching file list...")
        api = HfApi(endpoint=self.endpoint, token=self.token or False, user_agent=USER_AGENT)
        try:
            info = api.model_info(self.repo)
            entries = [e for e in api.list_repo_tree(self.repo, recursive=True) if isinstance(e, RepoFile)]
        except Exception as exc:
            raise _hub_error(exc, self.repo) from None
        self.last_modified = info.last_modified
        self.sizes = {e.path: int(e.size) for e in entries}
        selection = select_files(sorted(self.sizes), self.reference.original_tag, self.repo)
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
        folder = Path(tempfile.mkdtemp(prefix="modelrunner-hf-"))
        try:
            self._download_all(selection.all_files, folder)
            self.reporter.status("Building model artifact...")
            model_id = self._build(selection, folder)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        self.reporter.success("Model pulled successfully")
        return model_id

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
        sink = StoreSink(self.store)
        try:
            built = build_artifact(spec, sink, created=created)
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
        target = folder / path
        target.parent.mkdir(parents=True, exist_ok=True)
        url = f"{self.endpoint}/{self.repo}/resolve/main/{quote(path)}"
        endpoint_host = urlsplit(self.endpoint).netloc
        for _ in range(MAX_REDIRECTS):
            request = http.build_request("GET", url)
            if urlsplit(url).netloc != endpoint_host:
                request.headers.pop("Authorization", None)  # the token stays with the Hub
            response = http.send(request, stream=True)
            if response.status_code not in (301, 302, 303, 307, 308):
                break
            response.close()
            url = urljoin(url, response.headers.get("location", ""))
            netpolicy.check_target(url, endpoint_host, "redirect")
        else:
            raise RegistryUnavailable(f"too many redirects for {path}")
        with contextlib.closing(response):
            if response.status_code in (401, 403):
                raise RegistryUnauthorized(f"access to hf.co/{self.repo} was refused; check HF_TOKEN")
            if response.status_code >= 400:
                raise RegistryUnavailable(f"the Hub answered HTTP {response.status_code} for {path}")
            expected = self.sizes[path]
            written = 0
            with open(target, "wb") as handle:
                for chunk in response.iter_bytes():
                    if self.cancelled():
                        raise TransferCancelled("the pull was cancelled")
                    written += len(chunk)
                    if written > expected:
                        raise RegistryUnavailable(f"{path} is larger than the Hub said")
                    handle.write(chunk)
                    self.reporter.advance(path, len(chunk))
        if written != expected:
            raise RegistryUnavailable(f"{path} arrived incomplete ({written} of {expected} bytes)")
        self.reporter.layer_done(path)
