"""Labels of the daemon's request metrics (server/request_metrics.py): the model's name as the store and
`model ls` know it, a bounded number of them, and status classes."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from modelrunner.server import request_metrics
from modelrunner.server.lifecycle import Exchange, Lifecycle
from modelrunner.server.recorder import Recorder
from modelrunner.server.request_metrics import RequestMetrics, model_label, status_class


@pytest.mark.parametrize(
    ("name", "label"),
    [
        ("tiny", "tiny"),
        ("ai/tiny", "tiny"),
        ("ai/tiny:latest", "tiny"),
        ("docker.io/ai/tiny:latest", "tiny"),
        ("index.docker.io/ai/tiny", "tiny"),
        ("gemma3:270m", "gemma3:270m"),
        ("myorg/m:v1", "myorg/m:v1"),
        ("hf.co/org/repo-GGUF:Q4_K_M", "huggingface.co/org/repo-gguf:Q4_K_M"),
        ("sha256:" + "ab" * 32, "sha256:" + "ab" * 6),
        ("abababababab", "sha256:abababababab"),
        ("Not A Reference!", "other"),
    ],
)
def test_a_model_is_labelled_as_model_ls_names_it(name: str, label: str) -> None:
    assert model_label(name) == label


def test_model_labels_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(request_metrics, "MAX_MODEL_LABELS", 3)
    metrics = RequestMetrics()
    assert [metrics.label(f"m{i}") for i in range(5)] == ["m0", "m1", "m2", "other", "other"]
    assert metrics.label("ai/m1:latest") == "m1"  # a known model keeps its label, however it is spelled
    assert metrics.label(None) == metrics.label("") == ""


def test_status_classes() -> None:
    assert [status_class(s) for s in (200, 304, 400, 499, 503, 0)] == [
        "2xx",
        "3xx",
        "4xx",
        "4xx",
        "5xx",
        "none",
    ]


def test_a_request_without_a_model_is_only_counted() -> None:
    lifecycle = Lifecycle(None, Recorder())  # type: ignore[arg-type]  # no runner is involved here
    exchange = Exchange(lifecycle, "GET", "/models", {})
    exchange.started_answer(200)
    exchange.answered(b"[]", True)
    lifecycle.metrics.observe(exchange.access(), exchange.record)
    found = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(lifecycle.metrics.render())
        for sample in family.samples
    }
    key = ("modelrunner_requests_total", (("api", "dmr"), ("model", ""), ("status_class", "2xx")))
    assert found[key] == 1
    assert not any(
        name.startswith("modelrunner_request_duration") and value for (name, _), value in found.items()
    )
