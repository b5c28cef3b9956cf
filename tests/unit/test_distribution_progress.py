"""Progress events (contract 2.3) and the store's resumable blob writes."""

from __future__ import annotations

import hashlib
import html
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from modelrunner.distribution.progress import ProgressReporter, encode_line, event
from modelrunner.errors import InvalidArtifact
from modelrunner.store.store import ModelStore


def test_lines_are_json_or_html_escaped_json() -> None:
    item = event("progress", "Downloaded: 1.00 MB <&'\">", "pull", 10)
    raw = encode_line(item, html_escape=False)
    assert raw.endswith(b"\n") and json.loads(raw) == item
    escaped = encode_line(item, html_escape=True).decode()
    assert '"' not in escaped and "<" not in escaped and "&#34;" in escaped
    assert json.loads(html.unescape(escaped)) == item


def test_reporter_always_reports_layer_completion() -> None:
    events: list[dict[str, object]] = []
    reporter = ProgressReporter(events.append, "push", total=3000)
    reporter.add_layer("sha256:" + "a" * 64, 3000)
    for _ in range(3):
        reporter.advance("sha256:" + "a" * 64, 1000)
    reporter.layer_done("sha256:" + "a" * 64)
    reporter.success("Model pushed successfully")
    assert events[-2]["layer"] == {"id": "sha256:" + "a" * 64, "size": 3000, "current": 3000}
    assert events[-2]["message"] == "Uploaded: 0.00 MB" and events[-2]["mode"] == "push"
    assert len(events) < 6  # throttled: not one event per advance
    assert events[-1] == {
        "type": "success",
        "message": "Model pushed successfully",
        "total": 0,
        "layer": {"size": 0, "current": 0},
        "mode": "push",
    }
    assert reporter.transferred == 3000


def test_only_registered_layers_report() -> None:
    """DMR's pull (`pkg/distribution/internal/store/store.go`) and push (`oci/remote/remote.go`) make one
    Reporter per manifest layer: the config blob moves without an event, so no event has a layer of size 0
    or a total of 0; the message is `PullMsg`'s, the layer's own bytes in MiB."""
    events: list[dict[str, object]] = []
    reporter = ProgressReporter(events.append, "pull")
    config, layer = "sha256:" + "c" * 64, "sha256:" + "d" * 64
    reporter.set_layer(config, 0)
    reporter.advance(config, 300)
    reporter.layer_done(config)
    assert events == [] and reporter.transferred == 300
    reporter.total = 3 * 1024 * 1024
    reporter.add_layer(layer, 3 * 1024 * 1024)
    reporter.set_layer(layer, 0)
    reporter.advance(layer, 1024 * 1024 + 1024 * 1024 // 2)
    reporter.layer_done(layer)
    assert [e["layer"] for e in events] == [
        {"id": layer, "size": 3145728, "current": 0},
        {"id": layer, "size": 3145728, "current": 1572864},
        {"id": layer, "size": 3145728, "current": 3145728},
    ]
    assert [e["message"] for e in events] == [
        "Downloaded: 0.00 MB",
        "Downloaded: 1.50 MB",
        "Downloaded: 3.00 MB",
    ]
    assert {e["total"] for e in events} == {3145728}


@pytest.fixture
def store(tmp_path: Path) -> ModelStore:
    return ModelStore(tmp_path / "models")


DATA = bytes(range(256)) * 40
DIGEST = "sha256:" + hashlib.sha256(DATA).hexdigest()


def test_resume_continues_a_partial(store: ModelStore) -> None:
    store.layout.incomplete_path(DIGEST).write_bytes(DATA[:1000])
    assert store.partial_blob_size(DIGEST) == 1000
    store.resume_blob_stream(DIGEST, len(DATA), 1000, [DATA[1000:5000], DATA[5000:]])
    assert store.layout.blob_path(DIGEST).read_bytes() == DATA
    assert store.partial_blob_size(DIGEST) == 0


def test_offset_zero_starts_over(store: ModelStore) -> None:
    store.layout.incomplete_path(DIGEST).write_bytes(b"garbage" * 100)
    store.resume_blob_stream(DIGEST, len(DATA), 0, [DATA])
    assert store.has_blob(DIGEST, len(DATA))


def test_bad_prefix_is_caught_and_removed(store: ModelStore) -> None:
    store.layout.incomplete_path(DIGEST).write_bytes(b"x" * 1000)
    with pytest.raises(InvalidArtifact, match="does not match its digest"):
        store.resume_blob_stream(DIGEST, len(DATA), 1000, [DATA[1000:]])
    assert not store.layout.incomplete_path(DIGEST).exists()
    assert not store.has_blob(DIGEST)


def test_too_long_body_is_refused(store: ModelStore) -> None:
    with pytest.raises(InvalidArtifact, match="larger than its declared size"):
        store.resume_blob_stream(DIGEST, len(DATA), 0, [DATA, b"extra"])
    assert not store.layout.incomplete_path(DIGEST).exists()


def test_network_error_keeps_the_partial(store: ModelStore) -> None:
    def interrupted() -> Iterator[bytes]:
        yield DATA[:3000]
        raise ConnectionResetError("network went away")

    with pytest.raises(ConnectionResetError):
        store.resume_blob_stream(DIGEST, len(DATA), 0, interrupted())
    assert store.partial_blob_size(DIGEST) == 3000
    store.resume_blob_stream(DIGEST, len(DATA), 3000, [DATA[3000:]])
    assert store.has_blob(DIGEST, len(DATA))


def test_hostile_digest_never_becomes_a_path(store: ModelStore) -> None:
    from modelrunner.errors import InvalidDigest

    for bad in ("sha256:../../x", "sha256:" + "A" * 64, "sha512:" + "a" * 128, ""):
        with pytest.raises(InvalidDigest):
            store.resume_blob_stream(bad, 1, 0, [b"x"])
        with pytest.raises(InvalidDigest):
            store.partial_blob_size(bad)
