"""server/log_files.py: what `GET /logs` streams, read in chunks, followed across rotation, by model."""

from __future__ import annotations

import asyncio
from pathlib import Path

from modelrunner.server import log_files
from modelrunner.server.log_files import LogStreamer, ModelFilter
from modelrunner.store.store import ModelStore
from tests.models import write_tiny_gguf


async def never() -> bool:
    return False


def read_all(streamer: LogStreamer) -> tuple[bytes, list[int]]:
    async def collect() -> tuple[bytes, list[int]]:
        chunks = [chunk async for chunk in streamer.stream(follow=False)]
        return b"".join(chunks), [len(c) for c in chunks]

    return asyncio.run(collect())


def test_files_are_streamed_in_chunks_daemon_log_first(tmp_path: Path) -> None:
    big = b"".join(b"line %06d event=x\n" % i for i in range(20_000))  # ~380 KB
    (tmp_path / "daemon.log").write_bytes(big)
    (tmp_path / "engine-llama.cpp-0123456789ab-completion.log").write_bytes(b"engine says hi\n")
    data, sizes = read_all(LogStreamer(tmp_path, True, None, never))
    assert data == big + b"engine says hi\n"
    assert max(sizes) <= log_files.CHUNK  # never a whole file at once
    data, _ = read_all(LogStreamer(tmp_path, False, None, never))
    assert data == big


def test_following_picks_up_new_lines_new_engine_logs_and_rotation(tmp_path: Path) -> None:
    daemon_log = tmp_path / "daemon.log"
    daemon_log.write_bytes(b"one\n")

    async def scenario() -> bytes:
        left = False

        async def disconnected() -> bool:
            return left

        streamer = LogStreamer(tmp_path, True, None, disconnected)
        out = bytearray()
        stream = streamer.stream(follow=True)
        out += await asyncio.wait_for(anext(stream), 10)
        with open(daemon_log, "ab") as handle:
            handle.write(b"two\n")
        out += await asyncio.wait_for(anext(stream), 10)
        with open(daemon_log, "ab") as handle:
            handle.write(b"three\n")
        daemon_log.rename(tmp_path / "daemon.log.1")  # rotated right after a write we did not read yet
        daemon_log.write_bytes(b"four\n")
        (tmp_path / "engine-llama.cpp-0123456789ab-completion.log").write_bytes(b"engine\n")
        while out.count(b"\n") < 5:
            out += await asyncio.wait_for(anext(stream), 10)
        left = True
        async for chunk in stream:
            out += chunk
        return bytes(out)

    assert asyncio.run(scenario()) == b"one\ntwo\nthree\nfour\nengine\n"


def test_a_model_filter_keeps_its_lines_by_any_name_and_its_engine_logs(tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "models")
    from modelrunner.artifact.builder import PackageSpec, build_artifact
    from modelrunner.store.sink import StoreSink

    built = build_artifact(PackageSpec(gguf=write_tiny_gguf(tmp_path / "t.gguf")), StoreSink(store))
    model_id = store.add_model(built.manifest_bytes, ["ai/tiny:latest", "other/name:v2"])
    logs = tmp_path / "logs"
    logs.mkdir()
    lines = [
        b"T INFO scheduler event=load model=tiny engine=llama.cpp",
        b"T INFO scheduler event=evict model=ai/tiny:latest reason=idle_timeout",
        b'T INFO scheduler event=load model="other/name:v2" engine=llama.cpp',
        b"T INFO scheduler event=load model=someone-else",
        b"T INFO server msg=unrelated",
        b"T INFO scheduler event=refused model=tinyx status=503",
    ]
    (logs / "daemon.log").write_bytes(b"\n".join(lines))  # the last line has no newline yet
    hex12 = model_id.removeprefix("sha256:")[:12]
    (logs / f"engine-llama.cpp-{hex12}-completion.log").write_bytes(b"mine\n")
    (logs / "engine-llama.cpp-ffffffffffff-completion.log").write_bytes(b"not mine\n")
    data, _ = read_all(LogStreamer(logs, True, ModelFilter(store, "tiny"), never))
    assert data == b"\n".join([*lines[:3], b"mine"]) + b"\n"
    # a model removed since is still found by its name
    data, _ = read_all(LogStreamer(logs, False, ModelFilter(store, "someone-else:latest"), never))
    assert data == lines[3] + b"\n"
