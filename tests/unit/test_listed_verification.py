"""The /models listing's verifications (signing/record.listed_with_verification): the same objects as
with_verification of each model, with the records folder listed once instead of one open per model."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from modelrunner.artifact.builder import PackageSpec
from modelrunner.signing.record import listed_with_verification, record_verification, with_verification
from modelrunner.signing.registry import Verified
from modelrunner.store.store import ModelStore
from tests.models import write_tiny_gguf


def test_a_listing_shows_the_recorded_verification_and_opens_no_record_of_an_unsigned_model(
    store: ModelStore, package: Callable[..., str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    signed = package(PackageSpec(gguf=write_tiny_gguf(tmp_path / "a.gguf", seed=1)), ("team/signed:v1",))
    package(PackageSpec(gguf=write_tiny_gguf(tmp_path / "b.gguf", seed=2)), ("team/plain:v1",))
    record_verification(store, store.get(signed), Verified(signed, "sha256:key", "team/signed:v1"))
    models = store.list_models()
    expected = [with_verification(store, model.to_api()) for model in models]
    opened: list[str] = []
    real_open = Path.open

    def counted(self: Path, *args: Any, **kwargs: Any) -> Any:
        opened.append(self.name)
        return real_open(self, *args, **kwargs)

    monkeypatch.setattr(Path, "open", counted)
    listed = listed_with_verification(store, models)
    assert listed == expected
    assert [m.get("verification", {}).get("signer") for m in listed] == ["sha256:key", None]
    assert opened == [signed.removeprefix("sha256:") + ".json"]  # the signed model's record only


def test_a_store_without_records_lists_its_models_as_they_are(
    store: ModelStore, package: Callable[..., str], tmp_path: Path
) -> None:
    package(PackageSpec(gguf=write_tiny_gguf(tmp_path / "a.gguf")), ("team/plain:v1",))
    models = store.list_models()
    assert listed_with_verification(store, models) == [model.to_api() for model in models]
