"""Fixtures shared by the artifact and store tests (test_manifest, test_store, test_builder, test_archive).

The spirit of these tests: bad input gets a clear error and changes nothing. `refuses` checks all three
parts at once: the exception type, a non-empty message without absolute paths, and an unchanged store.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from modelrunner.artifact.builder import PackageSpec, build_artifact
from modelrunner.errors import ModelRunnerError
from modelrunner.store.sink import StoreSink
from modelrunner.store.store import ModelStore
from tests.models import write_tiny_gguf

FIXED_TIME = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)

Snapshot = dict[str, tuple[int, str] | None]


def snapshot(root: Path) -> Snapshot:
    """Every file (size and sha256) and folder (None) under root: two equal snapshots mean nothing changed."""
    state: Snapshot = {}
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root).as_posix()
        if path.is_dir() and not path.is_symlink():
            state[relative + "/"] = None
        else:
            data = path.read_bytes()
            state[relative] = (len(data), hashlib.sha256(data).hexdigest())
    return state


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModelStore:
    monkeypatch.delenv("DEFAULT_REGISTRY", raising=False)
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    return ModelStore(tmp_path / "models")


@pytest.fixture
def tiny_gguf(tmp_path: Path) -> Path:
    source = tmp_path / "src"
    source.mkdir(exist_ok=True)
    return write_tiny_gguf(source / "tiny.gguf")


@pytest.fixture
def package(store: ModelStore) -> Callable[..., str]:
    """Package a spec into the store (as `POST /models/create` does) and return the model ID."""

    def _package(spec: PackageSpec, tags: tuple[str, ...] = ()) -> str:
        built = build_artifact(spec, StoreSink(store), created=FIXED_TIME)
        return store.add_model(built.manifest_bytes, tags)

    return _package


@pytest.fixture
def tiny_model(package: Callable[..., str], tiny_gguf: Path) -> str:
    """The tiny GGUF packaged into the store and tagged ai/tiny; its model ID."""
    return package(PackageSpec(gguf=tiny_gguf), ("ai/tiny",))


def assert_clean_message(error: BaseException, *forbidden: str) -> None:
    """A user-facing message: present, and free of the test's absolute paths."""
    assert isinstance(error, ModelRunnerError)
    assert error.message.strip(), "the error message is empty"
    assert error.message == str(error)
    for text in forbidden:
        assert text not in error.message, f"the message shows an absolute path: {error.message!r}"


@pytest.fixture
def refuses(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Callable[..., contextlib.AbstractContextManager[pytest.ExceptionInfo[ModelRunnerError]]]:
    """`with refuses(InvalidArtifact, store): ...` asserts the exception type, a clean message, and that the
    store (every file under its root, with sizes and contents) is exactly as it was before."""
    forbidden = (str(tmp_path), str(tmp_path_factory.getbasetemp()))

    @contextlib.contextmanager
    def _refuses(
        error_type: type[ModelRunnerError], store: ModelStore | None = None
    ) -> Iterator[pytest.ExceptionInfo[ModelRunnerError]]:
        before = snapshot(store.layout.root) if store is not None else None
        with pytest.raises(error_type) as info:
            yield info
        assert_clean_message(info.value, *forbidden)
        if store is not None:
            assert snapshot(store.layout.root) == before, "a refused operation changed the store"

    return _refuses


@pytest.fixture
def take_snapshot() -> Callable[[Path], Snapshot]:
    """`take_snapshot(root)`: every file (size, sha256) and folder under root, for before/after checks."""
    return snapshot


@pytest.fixture
def new_sink(store: ModelStore) -> Callable[[], StoreSink]:
    """`new_sink()`: a fresh BlobSink into the store."""
    return lambda: StoreSink(store)
