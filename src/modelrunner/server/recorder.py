"""The request recorder: the last inference requests of each model and their answers, as DMR keeps them
(`pkg/metrics/openai_recorder.go`): `GET /engines/requests` answers JSON, or follows new records as
server-sent events (`Accept: text/event-stream`: `existing_request` events with `?include_existing=true`,
then `connected`, then one `new_request` per finished request); `?model=` filters.

Every API is recorded through the one request lifecycle (server/lifecycle.py), once a runner serves the
request: the client's request as it was sent (base64 media cut to 100 characters, as DMR does, here also
in Ollama, Anthropic and Responses bodies) and its answer; a streamed answer is shown whole, put back
together when the records are read, so the relay only keeps a bounded copy of the bytes it sends.

Beyond DMR: bodies are bounded (REQUEST_LIMIT, RESPONSE_LIMIT), so are the models kept (MAX_MODELS), and
all records together hold at most `MODEL_RUNNER_RECORD_MAX_BYTES` (64 MiB; the oldest go first, whichever
model they are of); a listing is written record by record, never whole in memory; the records of a model
outlive its runner (DMR drops them at unload); `MODEL_RUNNER_RECORD_REQUESTS=0` turns the recorder off.
Each record also carries fields of ours after DMR's (Go's decoder skips them):
`request_id` (its `X-Request-Id`); once finished, `duration_ms` and `ttfb_ms` (its access line's), and
`prompt_tokens` and `completion_tokens` where the answer says them (its usage, Ollama's counts, llama.cpp's
timings). The daemon's request metrics read the same counts, and the time of the answer's first body byte
(server/request_metrics.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import time
import weakref
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from modelrunner.artifact import gojson
from modelrunner.compat import assemble
from modelrunner.errors import ModelNotFound, ModelRunnerError
from modelrunner.response_reader import is_event_stream
from modelrunner.scheduler.memory import env_bytes
from modelrunner.scheduler.runner import Runner
from modelrunner.scheduler.settings import ModelSettings, backend_configuration
from modelrunner.server.access import Access, RequestHead
from modelrunner.server.routes import FAMILIES, OLLAMA, RESPONSES, engine_path
from modelrunner.store.store import ModelStore
from modelrunner.wire import event_document, sse_events, sse_field

RECORDS_PER_MODEL = 10  # DMR's maximumRecordsPerModel
SUBSCRIBER_BUFFER = 100  # DMR's subscriberChannelBuffer: a follower that lags loses records
MEDIA_KEPT = 100  # DMR's maxMediaDataLength
STREAM_ERROR_STATUS = 400  # DMR's defaultStreamingErrorCode
REQUEST_LIMIT = 512 * 1024
RESPONSE_LIMIT = 1024 * 1024
TAIL_KEPT = 64 * 1024  # the end of an answer longer than RESPONSE_LIMIT, where its token counts are
MAX_MODELS = 100
DEFAULT_MAX_BYTES = 64 * 2**20


def recording_enabled() -> bool:
    return os.environ.get("MODEL_RUNNER_RECORD_REQUESTS", "1").strip().lower() not in ("0", "false", "no")


def recorder_budget() -> int:
    """`MODEL_RUNNER_RECORD_MAX_BYTES` (e.g. `16MiB`): what all records together may hold."""
    return env_bytes("MODEL_RUNNER_RECORD_MAX_BYTES", DEFAULT_MAX_BYTES)


def compact_json(value: Any) -> bytes:
    """`value` as the listing and `requests -f` write it: as Go's json.Marshal does (DMR's recorder), `<`,
    `>` and `&` escaped too. A lone surrogate (a request may carry `"\\ud800"`) is written as its JSON
    escape, not refused mid-listing."""
    return gojson.dumps_text(value).encode("utf-8", "backslashreplace")


# -- request bodies ------------------------------------------------------------------------------------


def truncate_base64(data: str) -> str:
    """DMR's truncateBase64Data: a data URL keeps its header and 100 characters of payload, raw base64
    its first 100 characters, each followed by how many were cut."""
    if len(data) <= MEDIA_KEPT:
        return data
    if data.startswith("data:"):
        header, comma, payload = data.partition(",")
        if comma and len(payload) > MEDIA_KEPT:
            return f"{header},{payload[:MEDIA_KEPT]}...[truncated {len(payload) - MEDIA_KEPT} chars]"
        return data
    return f"{data[:MEDIA_KEPT]}...[truncated {len(data) - MEDIA_KEPT} chars]"


def truncate_media(body: bytes) -> str:
    """The request as recorded. DMR's truncateMediaFields: a JSON object with a `messages` array has the
    base64 of its `image_url.url` and `input_audio.data` parts cut and is written again the Go way;
    anything else stays as it was. Here also: Ollama's `images` (top level and per message), Anthropic's
    `source.data` parts and the Responses API's `input_image` parts."""
    text = body.decode("utf-8", "replace")
    try:
        doc = json.loads(body, parse_constant=_refuse_constant)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return text
    if not isinstance(doc, dict):
        return text
    changed = _cut_images(doc.get("images"))
    items = doc.get("input")
    for item in items if isinstance(items, list) else []:
        changed |= _cut_parts(item.get("content") if isinstance(item, dict) else None)
    messages = doc.get("messages")
    if isinstance(messages, list):
        for message in messages:
            if isinstance(message, dict):
                _cut_parts(message.get("content"))
                _cut_images(message.get("images"))
        return gojson.dumps_text(gojson.as_interface(doc))
    return gojson.dumps_text(gojson.as_interface(doc)) if changed else text


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")  # Go's decoder refuses NaN and Infinity: the body stays as it was


def _cut_images(images: Any) -> bool:
    if not isinstance(images, list):
        return False
    for i, image in enumerate(images):
        if isinstance(image, str):
            images[i] = truncate_base64(image)
    return True


def _cut_parts(content: Any) -> bool:
    changed = False
    for part in content if isinstance(content, list) else []:
        if not isinstance(part, dict):
            continue
        for key, field in (("image_url", "url"), ("input_audio", "data"), ("source", "data")):
            holder = part.get(key)
            if isinstance(holder, dict) and isinstance(holder.get(field), str):
                holder[field] = truncate_base64(holder[field])
                changed = True
        if isinstance(part.get("image_url"), str):  # the Responses API's input_image
            part["image_url"] = truncate_base64(part["image_url"])
            changed = True
    return changed


# -- answers ---------------------------------------------------------------------------------------------


def normalize_error(text: str) -> str:
    """DMR's normalizeErrorToJSON: JSON as it is, anything else as `{"error": "<text>"}`."""
    if not text:
        return '{"error": "unknown error"}'
    try:
        json.loads(text)
    except ValueError:
        return f'{{"error": {gojson.dumps_text(text)}}}'  # DMR's Sprintf around json.Marshal of the text
    return text


def streaming_error(message: str, details: str, kind: str | None = None, status: int | None = None) -> str:
    """DMR's StreamingError, as it serializes it."""
    error: dict[str, Any] = {"status_code": status or STREAM_ERROR_STATUS, "message": message}
    if kind:
        error["type"] = kind
    if details:  # omitempty
        error["details"] = details
    return gojson.dumps_text(error)


def _events(raw: bytes) -> list[tuple[str | None, dict[str, Any], str]]:
    out = []
    for event, payload in sse_events(raw):
        if (doc := event_document(payload)) is not None:
            out.append((event, doc, payload.decode("utf-8", "replace")))
    return out


def _stream_error(event: str | None, doc: dict[str, Any], payload: str) -> str | None:
    """The StreamingError of an event that reports a failure (the engine's, or ours), else None."""
    error = doc.get("error")
    if event == "error" or doc.get("type") == "error":
        inner = error if isinstance(error, dict) else doc
        return streaming_error(str(inner.get("message") or "streaming error"), payload, inner.get("type"))
    if error is not None and "choices" not in doc:
        if isinstance(error, dict):
            code = error.get("code")
            status = code if isinstance(code, int) else None
            return streaming_error(
                str(error.get("message") or "streaming error"), payload, error.get("type"), status
            )
        return streaming_error(str(error), payload)
    return None


def reassemble(api: str, url: str, content_type: str, raw: bytes) -> tuple[str, str]:
    """(response, error) of a successful answer: a streamed one put back together (DMR's
    convertStreamingResponse and convertAnthropicStreamingResponse), whole ones as they are."""
    text = raw.decode("utf-8", "replace")
    if api == OLLAMA and "ndjson" in content_type:
        return _ollama(raw, text)
    if not is_event_stream(content_type) and b"data: " not in raw:
        return text, ""
    events = _events(raw)
    for event, doc, payload in events:
        error = _stream_error(event, doc, payload)
        if error is not None:
            return "", error
    if api == RESPONSES:
        finals = [doc["response"] for _, doc, _ in events if isinstance(doc.get("response"), dict)]
        return (_go_marshal(finals[-1]), "") if finals else (text, "")
    assembler = assemble.assembler_for(engine_path(url) or assemble.CHAT)  # the shape of the path's stream
    try:
        for event, doc, _ in events:
            assembler.add(event, doc)
        return _go_marshal(assembler.result()), ""
    except assemble.AssemblyError:
        return text, ""  # cut short: the bytes as they were sent


def _ollama(raw: bytes, text: str) -> tuple[str, str]:
    lines = []
    for line in raw.splitlines():
        try:
            doc = json.loads(line)
        except (ValueError, UnicodeDecodeError):
            continue
        if isinstance(doc, dict):
            if "error" in doc:
                return "", streaming_error(str(doc["error"]), line.decode("utf-8", "replace"))
            lines.append(doc)
    if not lines:
        return text, ""
    merged = dict(lines[-1])
    for key in ("response", "thinking"):
        if any(key in doc for doc in lines):
            merged[key] = "".join(str(doc.get(key) or "") for doc in lines)
    messages = [doc["message"] for doc in lines if isinstance(doc.get("message"), dict)]
    if messages:
        message = dict(messages[-1])
        for key in ("content", "thinking"):
            message[key] = "".join(str(m.get(key) or "") for m in messages)
        calls = [call for m in messages for call in m.get("tool_calls") or []]
        if calls:
            message["tool_calls"] = calls
        if not message.get("thinking"):
            message.pop("thinking", None)
        merged["message"] = message
    return _go_marshal(merged), ""


def _go_marshal(document: dict[str, Any]) -> str:
    """An assembled answer as DMR's recorder writes it: json.Marshal of a map (keys sorted, compact)."""
    return gojson.dumps_text(gojson.as_interface(document))


# Keys whose presence in a line of an answer says it may carry token counts.
_COUNT_MARKERS = (b'"usage"', b'"eval_count"', b'"predicted_n"')


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def token_counts(doc: dict[str, Any]) -> tuple[int | None, int | None]:
    """(prompt, completion) tokens of one JSON answer or event, as far as it says them: OpenAI's,
    Anthropic's and the Responses API's `usage` (also inside `response` and `message`), Ollama's
    `prompt_eval_count`/`eval_count`, else llama.cpp's own `timings` (streams sent without usage)."""
    usage = doc.get("usage")
    for holder in ("response", "message"):
        inner = doc.get(holder)
        if not isinstance(usage, dict) and isinstance(inner, dict):
            usage = inner.get("usage")
    if isinstance(usage, dict):
        prompt = _count(usage.get("prompt_tokens"))
        if prompt is None and _count(usage.get("input_tokens")) is not None:  # cache reads counted apart
            parts = ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
            prompt = sum(_count(usage.get(part)) or 0 for part in parts)
        return prompt, _count(usage.get("completion_tokens", usage.get("output_tokens")))
    if "eval_count" in doc or "prompt_eval_count" in doc:
        return _count(doc.get("prompt_eval_count")), _count(doc.get("eval_count"))
    timings = doc.get("timings")
    if isinstance(timings, dict):
        processed, cached = _count(timings.get("prompt_n")), _count(timings.get("cache_n")) or 0
        return (None if processed is None else processed + cached), _count(timings.get("predicted_n"))
    return None, None


def answer_usage(raw: bytes | bytearray) -> tuple[int | None, int | None]:
    """(prompt, completion) tokens of an answer's data (whole, streamed, or only its end): the last lines
    that say them, found from the end (a stream states its counts in its last events; Anthropic's prompt
    count is in its first). Lines that are not JSON (`event:` lines) are passed over."""
    prompt: int | None = None
    completion: int | None = None
    end = len(raw)
    while prompt is None or completion is None:
        at = max(raw.rfind(marker, 0, end) for marker in _COUNT_MARKERS)
        if at < 0:
            break
        start = raw.rfind(b"\n", 0, at) + 1
        stop = raw.find(b"\n", at)
        line = raw[start : len(raw) if stop < 0 else stop].strip()
        end = start
        name, value = sse_field(bytes(line))
        if name == b"data":
            line = value
        try:
            doc = json.loads(line)
        except (ValueError, UnicodeDecodeError, RecursionError):
            continue
        if isinstance(doc, dict):
            found_prompt, found_completion = token_counts(doc)
            prompt = found_prompt if prompt is None else prompt
            completion = found_completion if completion is None else completion
    return prompt, completion


class Record:
    """One request and its answer; the answer's data is kept (bounded) and read when shown. Once
    finished and shown, only its JSON is kept (`size` counts what it holds)."""

    def __init__(
        self, head: RequestHead, model: str, model_id: str, config: dict[str, Any], request: bytes
    ) -> None:
        self.id = f"{model_id}_{time.time_ns()}"
        self.model = model
        self.model_id = model_id
        self.config = config
        self.api = head.api
        self.method = head.method
        self.url = head.path
        self.request = request
        self.timestamp = int(time.time())
        self.user_agent = head.user_agent
        self.request_id = head.request_id  # ours: the X-Request-Id of its access and log lines
        family = FAMILIES[head.api]  # DMR's X-Request-Origin, for the family's generations
        generation = family.origin_paths is None or head.path in family.origin_paths
        self.origin = family.origin if generation else ""
        self.status_code = 0
        self.content_type = ""
        self.finished = False
        self.first_data: float | None = None  # monotonic time of the answer's first body byte
        self.timing: dict[str, float | None] = {}  # ours: duration_ms, ttfb_ms (the access line's)
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None
        self._response = bytearray()
        self._tail = bytearray()  # the last bytes beyond RESPONSE_LIMIT, until finished
        self._shown: bytes | None = None
        self.owner: Recorder | None = None  # the recorder that keeps it, until it goes
        self.accounted = 0  # its size as the owner last counted it

    def answer_head(self, status: int, headers: Iterable[tuple[bytes, bytes]]) -> None:
        self.status_code = status
        for name, value in headers:
            if name.lower() == b"content-type":
                self.content_type = value.decode("latin-1").lower()

    @property
    def streamed(self) -> bool:
        return is_event_stream(self.content_type) or "ndjson" in self.content_type

    @property
    def size(self) -> int:
        """The bytes it holds: its bodies (while it runs, at most REQUEST_LIMIT, RESPONSE_LIMIT and
        2 * TAIL_KEPT of the answer's end), or its JSON once shown."""
        return len(self.request) + len(self._response) + len(self._tail) + len(self._shown or b"")

    @property
    def room(self) -> int:
        """How many more bytes of the answer's data are kept whole (beyond them, only its last TAIL_KEPT)."""
        return max(RESPONSE_LIMIT - len(self._response), 0)

    def tee(self, data: bytes) -> None:
        """The answer's next data, unframed (every relay hands over the body's data, not its framing)."""
        if self.first_data is None:
            self.first_data = time.monotonic()
        room = RESPONSE_LIMIT - len(self._response)
        if room >= len(data):  # the common case: no slices to copy
            self._response += data
        else:
            if room > 0:
                self._response += data[:room]
                data = data[room:]
            self._tail += data
            if len(self._tail) > 2 * TAIL_KEPT:
                del self._tail[:-TAIL_KEPT]
        if self.owner is not None:  # counted as it grows: the budget holds while requests run too
            self.owner.account(self)

    def finish(self, access: Access) -> None:
        """The request is over: its timing from the access line, its token counts from its answer."""
        self.finished = True
        self.timing = {"duration_ms": access.duration_ms, "ttfb_ms": access.ttfb_ms}
        if (self.status_code or 408) < 400:
            end = self._tail[-TAIL_KEPT:] if self._tail else self._response  # where a stream says its counts
            self.prompt_tokens, self.completion_tokens = answer_usage(end)
            if self.prompt_tokens is None and self._tail:  # Anthropic's is in its first event
                self.prompt_tokens = answer_usage(self._response)[0]
        self._tail = bytearray()

    def shown(self) -> bytes:
        """The record's JSON as listed; once it is finished, computed once and kept instead of its bodies."""
        if self._shown is not None:
            return self._shown
        data = compact_json(self._document())
        if self.finished:
            self._shown = data
            self.request = b""  # the JSON holds what is shown of them: the bytes are no longer needed
            self._response = bytearray()
        return data

    def to_json(self) -> dict[str, Any]:
        """DMR's RequestResponsePair (empty `response`, `error`, `user_agent`, `origin` left out)."""
        return json.loads(self.shown())  # type: ignore[no-any-return]

    def _document(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "model": self.model,
            "method": self.method,
            "url": self.url,
            "request": truncate_media(self.request),
        }
        if self.finished:
            status = self.status_code or 408  # DMR: nothing was answered (the request was cancelled)
            raw = bytes(self._response)
            if status >= 400:
                response, error = "", normalize_error(raw.decode("utf-8", "replace"))
            else:
                response, error = reassemble(self.api, self.url, self.content_type, raw)
            if response:
                out["response"] = response
            if error:
                out["error"] = error
            out["timestamp"] = self.timestamp
            out["status_code"] = status
        else:
            out |= {"timestamp": self.timestamp, "status_code": 0}
        if self.user_agent:
            out["user_agent"] = self.user_agent
        if self.origin:
            out["origin"] = self.origin
        out["request_id"] = self.request_id
        if self.finished:
            out |= {key: value for key, value in self.timing.items() if value is not None}
            if self.prompt_tokens is not None:
                out["prompt_tokens"] = self.prompt_tokens
            if self.completion_tokens is not None:
                out["completion_tokens"] = self.completion_tokens
        return out


@dataclass(eq=False)
class _Follower:
    model_id: str | None
    queue: asyncio.Queue[bytes | None] = dataclasses.field(
        default_factory=lambda: asyncio.Queue(SUBSCRIBER_BUFFER)
    )


def _entry(
    model: str, config: dict[str, Any], records: list[Record], shown: Callable[[Record], bytes]
) -> Iterator[bytes]:
    """One model's entry of DMR's ModelRecordsResponse (its JSON field order), written a record at a time."""
    head = compact_json({"count": len(records), "model": model, "config": config})
    yield head[:-1] + b',"records":['
    for i, record in enumerate(records):
        if i:
            yield b","
        yield shown(record)  # as it is kept: not copied
    yield b"]}"


class Recorder:
    """The records of every model (by model ID, the last RECORDS_PER_MODEL each) and their followers, all
    of them together within `max_bytes` (the oldest records go first, whichever model they are of)."""

    request_limit = REQUEST_LIMIT

    def __init__(self, max_bytes: int | None = None) -> None:
        self.max_bytes = recorder_budget() if max_bytes is None else max_bytes
        self.size = 0  # the bytes the records hold, as last counted
        self.models: OrderedDict[str, deque[Record]] = OrderedDict()
        self._oldest: OrderedDict[Record, None] = OrderedDict()  # every record kept, oldest first
        self._followers: set[_Follower] = set()
        self._runner_configs: weakref.WeakKeyDictionary[Runner, dict[str, Any]] = weakref.WeakKeyDictionary()

    def runner_config(self, runner: Runner, settings: Callable[[], ModelSettings | None]) -> dict[str, Any]:
        """The configuration a runner was started with, read once per runner (as DMR sets it at start)."""
        config = self._runner_configs.get(runner)
        if config is None:
            stored = settings()
            config = self._runner_configs[runner] = backend_configuration(stored) if stored else {}
        return config

    def start(
        self, head: RequestHead, request: bytes, model: str, model_id: str, config: dict[str, Any]
    ) -> Record:
        """A record of the request `head` (`request`: its body as kept), now that a runner answers it."""
        record = Record(head, model, model_id, config, request)
        records = self.models.get(model_id)
        if records is None:
            records = self.models[model_id] = deque()
            while len(self.models) > MAX_MODELS:
                for old in list(next(iter(self.models.values()))):
                    self._forget(old)
        self.models.move_to_end(model_id)
        if len(records) == RECORDS_PER_MODEL:
            self._forget(records[0])
        records.append(record)
        self._oldest[record] = None
        record.owner = self
        self.account(record)
        return record

    def _forget(self, record: Record) -> None:
        if record in self._oldest:
            del self._oldest[record]
            record.owner = None
            records = self.models[record.model_id]
            records.remove(record)
            if not records:
                del self.models[record.model_id]
            self.size -= record.accounted

    def account(self, record: Record) -> None:
        """Count what `record` holds now, then keep within the budget: a record larger than all of it is
        not kept, else the oldest go until the rest fit. A record that goes while it is still answered is
        bounded by itself (REQUEST_LIMIT, RESPONSE_LIMIT, TAIL_KEPT) and still reaches the followers."""
        if record not in self._oldest:
            return
        size = record.size
        self.size += size - record.accounted
        record.accounted = size
        if size > self.max_bytes:
            self._forget(record)
        while self.size > self.max_bytes and self._oldest:
            self._forget(next(iter(self._oldest)))

    def _shown(self, record: Record) -> bytes:
        data = record.shown()
        self.account(record)  # its bodies may have given way to its JSON
        return data

    def finish(self, record: Record, access: Access) -> None:
        """The record's request is over (`access`: what its access line says)."""
        record.finish(access)
        self.account(record)
        if self._followers:
            payload = self._payload(record.model, record.config, [record])
            event = b"event: new_request\ndata: " + payload + b"\n\n"
            for follower in list(self._followers):
                if follower.model_id in (None, record.model_id) and not follower.queue.full():
                    follower.queue.put_nowait(event)

    def _payload(self, model: str, config: dict[str, Any], records: list[Record]) -> bytes:
        """DMR's ModelRecordsResponse list of one entry."""
        return b"[" + b"".join(_entry(model, config, records, self._shown)) + b"]"

    def listing_chunks(self, model_id: str | None) -> Iterator[bytes]:
        """DMR's ModelRecordsResponse list of every model (or one), written a record at a time: each chunk
        is a record's JSON as kept, or a few bytes around it. Records may come and go between chunks: each
        model's are taken when its turn comes."""
        ids = list(self.models) if model_id is None else [model_id] if model_id in self.models else []
        yield b"["
        first = True
        for key in ids:
            records = list(self.models.get(key, ()))
            if not records:
                continue
            if not first:
                yield b","
            first = False
            yield from _entry(key, records[-1].config, records, self._shown)  # the newest one's configuration
        yield b"]"

    def listing(self, model_id: str | None) -> list[dict[str, Any]]:
        """The listing as documents, whole (the route writes `listing_chunks` as they come)."""
        return json.loads(b"".join(self.listing_chunks(model_id)))  # type: ignore[no-any-return]

    async def follow(self, model_id: str | None, include_existing: bool) -> AsyncIterator[bytes]:
        follower = _Follower(model_id)
        self._followers.add(follower)
        try:
            if include_existing:
                for key in list(self.models) if model_id is None else [model_id]:
                    records = list(self.models.get(key, ()))
                    for record in records:
                        payload = self._payload(key, records[-1].config, [record])
                        yield b"event: existing_request\ndata: " + payload + b"\n\n"
            yield b'event: connected\ndata: {"status": "connected"}\n\n'
            while (event := await follower.queue.get()) is not None:
                yield event
        finally:
            self._followers.discard(follower)

    def close(self) -> None:
        """End every follower (the daemon is stopping)."""
        for follower in list(self._followers):
            while follower.queue.full():
                follower.queue.get_nowait()
            follower.queue.put_nowait(None)


def build_recorder_router(recorder: Recorder | None, store: ModelStore) -> APIRouter:
    router = APIRouter()

    def resolve(model: str | None) -> str | None:
        if not model:
            return None
        try:
            return store.get(model).id
        except (ModelNotFound, ModelRunnerError):
            return model  # DMR's ResolveID: an unknown name is kept, and matches nothing

    @router.get("/engines/requests")
    async def requests(request: Request, model: str | None = None, include_existing: str = "") -> Response:
        model_id = resolve(model)
        if request.headers.get("accept", "") == "text/event-stream":
            if recorder is None:
                return Response(
                    b'event: connected\ndata: {"status": "connected"}\n\n', media_type="text/event-stream"
                )
            return StreamingResponse(
                recorder.follow(model_id, include_existing == "true"),
                media_type="text/event-stream",
                headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
            )
        if recorder is None:
            return JSONResponse([])
        return StreamingResponse(_each(recorder.listing_chunks(model_id)), media_type="application/json")

    return router


async def _each(chunks: Iterable[bytes]) -> AsyncIterator[bytes]:
    """The chunks on the event loop, where the recorder lives (Starlette would iterate them in a thread)."""
    for chunk in chunks:
        yield chunk
