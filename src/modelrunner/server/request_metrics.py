"""The daemon's own request metrics, for `/metrics`: observed once per request, where its access line is
written (server/lifecycle.py), from the same timing.

* `modelrunner_requests_total{api,model,status_class}`: every request, by API family and status class
  (`2xx` ... `5xx`; a client that left before its answer is a 499, `4xx`).
* `modelrunner_request_duration_seconds`, `modelrunner_time_to_first_byte_seconds` (the answer's head)
  and `modelrunner_time_to_first_token_seconds` (the first body byte of a streamed answer: llama.cpp,
  vLLM and our translations send it with the first token), histograms by `api` and `model`, of
  successful requests that named a model.
* `modelrunner_prompt_tokens_total` and `modelrunner_generated_tokens_total` by `api` and `model`, where
  the answer says its counts (its usage, Ollama's counts, llama.cpp's timings).
* `modelrunner_tool_calls_rescued_total` by `api` and `model`: tool calls an engine wrote as text that the
  answer carries as calls.

Streams, first body bytes and token counts are read from the request recorder's copy of the answer
(server/recorder.py); with `MODEL_RUNNER_RECORD_REQUESTS=0` only counts, durations and first bytes are kept.
Label values are bounded: `api` is one of the route table's families (server/routes.py, FAMILIES), `model`
the model's name as the store knows it (a request is only timed once the store found its model), at most
MAX_MODEL_LABELS of them, then "other".
"""

from __future__ import annotations

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Histogram

from modelrunner.display import display_name
from modelrunner.errors import ModelRunnerError
from modelrunner.reference import parse_model_id, parse_reference
from modelrunner.server.access import Access
from modelrunner.server.recorder import Record

MAX_MODEL_LABELS = 100
OTHER_MODELS = "other"
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)

# no `_created` series: half as many lines, and nothing reads them
prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]


def status_class(status: int) -> str:
    return f"{status // 100}xx" if 100 <= status < 600 else "none"


def model_label(name: str) -> str:
    """How a model found in the store is named in labels: as `model ls` shows it (`smollm2`,
    `myorg/m:v1`), or its short ID when it was asked for by ID."""
    try:
        model_id = parse_model_id(name)
        return model_id[: len("sha256:") + 12] if model_id else display_name(str(parse_reference(name)))
    except ModelRunnerError:
        return OTHER_MODELS


class RequestMetrics:
    """The request metrics of one daemon, in a registry of its own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        by_model = ["api", "model"]
        self.requests = Counter(
            "modelrunner_requests",
            "Requests answered, by API family, model (empty when none was named) and status class.",
            ["api", "model", "status_class"],
            registry=self.registry,
        )
        self.duration = Histogram(
            "modelrunner_request_duration_seconds",
            "Seconds from a request's first byte to its answer's last, successful requests to a model.",
            by_model,
            buckets=DURATION_BUCKETS,
            registry=self.registry,
        )
        self.first_byte = Histogram(
            "modelrunner_time_to_first_byte_seconds",
            "Seconds until the answer's head was sent, successful requests to a model.",
            by_model,
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.first_token = Histogram(
            "modelrunner_time_to_first_token_seconds",
            "Seconds until the first body byte of a streamed answer (the first token), successful requests.",
            by_model,
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.prompt_tokens = Counter(
            "modelrunner_prompt_tokens",
            "Prompt tokens of answered requests, where the answer says them.",
            by_model,
            registry=self.registry,
        )
        self.generated_tokens = Counter(
            "modelrunner_generated_tokens",
            "Tokens generated in answers, where the answer says them.",
            by_model,
            registry=self.registry,
        )
        self.tool_rescues = Counter(
            "modelrunner_tool_calls_rescued",
            "Tool calls an engine wrote as text that the daemon answered as calls (compat/tool_rescue.py).",
            by_model,
            registry=self.registry,
        )
        self._labels: dict[str, str] = {}  # name as requested -> label
        # each labelled series once: prometheus_client's labels() validates and locks on every call (~1.4
        # us, six a request); bounded as the labels are
        self._counted: dict[tuple[str, str, str], Counter] = {}
        self._timed: dict[tuple[str, str], _ModelSeries] = {}

    def label(self, name: str | None) -> str:
        if not name:
            return ""
        found = self._labels.get(name)
        if found is None:
            found = model_label(name)
            known = set(self._labels.values())
            if found not in known and len(known) >= MAX_MODEL_LABELS:
                found = OTHER_MODELS
            if len(self._labels) < 10 * MAX_MODEL_LABELS:  # spellings of one model share its label
                self._labels[name] = found
        return found

    def rescued(self, api: str, model: str | None, count: int) -> None:
        self.tool_rescues.labels(api, self.label(model)).inc(count)

    def observe(self, access: Access, record: Record | None) -> None:
        """One finished request, with the recorder's copy of its answer (None when it was not recorded)."""
        status = access.status
        model = self.label(access.model)
        api = access.head.api
        counted = (api, model, status_class(status))
        requests = self._counted.get(counted)
        if requests is None:
            requests = self._counted[counted] = self.requests.labels(*counted)
        requests.inc()
        if not model or not 200 <= status < 400:
            return
        series = self._timed.get((api, model))
        if series is None:
            series = self._timed[api, model] = _ModelSeries(self, api, model)
        series.duration.observe(access.duration_ms / 1000)
        if access.ttfb_ms is not None:
            series.first_byte.observe(access.ttfb_ms / 1000)
        if record is None:
            return
        if record.streamed and record.first_data is not None:
            series.first_token.observe(max(0.0, record.first_data - access.head.started))
        if record.prompt_tokens:
            series.prompt_tokens.inc(record.prompt_tokens)
        if record.completion_tokens:
            series.generated_tokens.inc(record.completion_tokens)

    def render(self) -> str:
        return prometheus_client.generate_latest(self.registry).decode()


class _ModelSeries:
    """The series of one API family and model that a successful request adds to."""

    __slots__ = ("duration", "first_byte", "first_token", "generated_tokens", "prompt_tokens")

    def __init__(self, metrics: RequestMetrics, api: str, model: str) -> None:
        self.duration = metrics.duration.labels(api, model)
        self.first_byte = metrics.first_byte.labels(api, model)
        self.first_token = metrics.first_token.labels(api, model)
        self.prompt_tokens = metrics.prompt_tokens.labels(api, model)
        self.generated_tokens = metrics.generated_tokens.labels(api, model)
