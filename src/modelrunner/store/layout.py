"""Where things live inside the store (contract section 4). Digests become paths only here."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from modelrunner.digest import validate_digest

LAYOUT_VERSION = "1.0.0"


@dataclass(frozen=True)
class StoreLayout:
    root: Path

    @property
    def layout_file(self) -> Path:
        return self.root / "layout.json"

    @property
    def index_file(self) -> Path:
        return self.root / "models.json"

    @property
    def lock_file(self) -> Path:
        return self.root / ".models.json.lock"

    @property
    def tags_marker(self) -> Path:
        """Present once the index's tags are in DMR's form (ModelStore._migrate_tags); DMR ignores it."""
        return self.root / ".modelrunner-tags-v2"

    @property
    def blobs_dir(self) -> Path:
        return self.root / "blobs" / "sha256"

    @property
    def manifests_dir(self) -> Path:
        return self.root / "manifests" / "sha256"

    @property
    def bundles_dir(self) -> Path:
        return self.root / "bundles" / "sha256"

    @property
    def downloads_dir(self) -> Path:
        """Files being downloaded that are not blobs yet (Hugging Face pulls), kept to resume."""
        return self.root / "downloads"

    @property
    def configs_dir(self) -> Path:
        """Per-model runtime configuration (`model configure`), persisted next to the models."""
        return self.root / "configs"

    @property
    def kv_cache_dir(self) -> Path:
        """Saved prompt caches of runners (warm resume, scheduler/kv_persist.py), per model."""
        return self.root / "cache" / "kv"

    def kv_cache_path(self, model_id: str) -> Path:
        return self.kv_cache_dir / self.blob_path(model_id).name

    def blob_path(self, digest: str) -> Path:
        """The one place a digest becomes a path: anything but sha256:<64 lowercase hex> is refused."""
        return self.blobs_dir / validate_digest(digest).removeprefix("sha256:")

    def incomplete_path(self, digest: str) -> Path:
        return self.blob_path(digest).with_suffix(".incomplete")

    def manifest_path(self, model_id: str) -> Path:
        return self.manifests_dir / self.blob_path(model_id).name

    def bundle_path(self, model_id: str) -> Path:
        return self.bundles_dir / self.blob_path(model_id).name
