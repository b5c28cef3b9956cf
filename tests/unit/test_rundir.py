"""The runtime directory on a host shared with other users: another user's directory, link, pid record or
socket is never used (scheduler/rundir.py)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from modelrunner.engines.base import LaunchSpec, Mode, ModelForEngine
from modelrunner.scheduler import rundir
from modelrunner.scheduler.rundir import UnsafeRuntimeDir, ensure_private_dir
from modelrunner.scheduler.runner import LoadError, Runner, RunnerKey, end_orphans
from modelrunner.scheduler.scheduler import Scheduler, SchedulerLimits
from modelrunner.scheduler.settings import SettingsStore
from modelrunner.server.engine_pool import EnginePool
from modelrunner.server.upstream import EngineCall, EngineUnreachable
from tests.users import OTHER_UID, need_root


def test_a_new_runtime_dir_is_private(tmp_path: Path) -> None:
    path = ensure_private_dir(tmp_path / "run")
    assert path.is_dir() and (path.stat().st_mode & 0o777) == 0o700


def test_a_runtime_dir_of_another_user_is_refused(tmp_path: Path) -> None:
    need_root("makes a directory owned by another user")
    path = tmp_path / "run"
    path.mkdir(mode=0o700)
    os.chown(path, OTHER_UID, OTHER_UID)
    with pytest.raises(UnsafeRuntimeDir, match=f"belongs to uid {OTHER_UID}"):
        ensure_private_dir(path)
    with pytest.raises(UnsafeRuntimeDir):  # the daemon does not start with it
        Scheduler({}, SettingsStore(tmp_path / "configs"), path, tmp_path / "logs", SchedulerLimits(1, 1))


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o702, 0o1777])
def test_a_runtime_dir_others_may_write_in_is_refused(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "run"
    path.mkdir()
    path.chmod(mode)
    with pytest.raises(UnsafeRuntimeDir, match="may be written by other users"):
        ensure_private_dir(path)


def test_a_runtime_dir_others_may_only_read_is_closed_to_them(tmp_path: Path) -> None:
    path = tmp_path / "run"
    path.mkdir()
    path.chmod(0o755)  # what daemons before this check made: nobody else could write in it
    ensure_private_dir(path)
    assert (path.stat().st_mode & 0o777) == 0o700


def test_a_runtime_dir_that_is_a_link_is_refused(tmp_path: Path) -> None:
    target = ensure_private_dir(tmp_path / "elsewhere")
    (tmp_path / "run").symlink_to(target)
    with pytest.raises(UnsafeRuntimeDir, match="symbolic link"):
        ensure_private_dir(tmp_path / "run")


def test_the_runtime_dir_is_in_xdg_runtime_dir_when_short_enough(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    short = Path(tempfile.mkdtemp(prefix="xdg-", dir="/tmp"))  # as /run/user/UID is: pytest's may be too long
    try:
        monkeypatch.setenv("XDG_RUNTIME_DIR", str(short))
        path = rundir.runtime_dir(tmp_path / "home")
        assert path.parent == short and path == rundir.runtime_dir(tmp_path / "home")
    finally:
        short.rmdir()
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / ("x" * 90)))  # sockets there would not fit
    long = rundir.runtime_dir(tmp_path / "home")
    assert long.name == path.name and len(str(long)) + rundir.SOCKET_NAME_ROOM <= rundir.MAX_SOCKET_PATH


def runner(tmp_path: Path, argv: list[str]) -> Runner:
    run = ensure_private_dir(tmp_path / "run")
    model = ModelForEngine("sha256:" + "0" * 64, "ai/x", tmp_path, "gguf", None, 1)
    spec = LaunchSpec(argv=argv, socket=run / "runner-1.sock")
    return Runner(
        RunnerKey("llama.cpp", model.id, Mode.COMPLETION),
        model,
        spec,
        1,
        tmp_path / "e.log",
        run / "pids",
        60,
    )


def test_a_linked_pid_record_is_replaced_not_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    engine = runner(tmp_path, ["x"])
    engine.process = SimpleNamespace(pid=4242)  # type: ignore[assignment]  # only its pid is recorded
    engine.pid_dir.mkdir()
    (engine.pid_dir / "4242.json").symlink_to(victim)
    engine._record_pid()
    assert victim.read_text() == "precious\n"
    record = engine.pid_dir / "4242.json"
    assert not record.is_symlink() and json.loads(record.read_text())["pid"] == 4242
    assert (record.stat().st_mode & 0o777) == 0o600


def test_a_linked_pid_record_is_not_read_at_start(tmp_path: Path) -> None:
    pids = ensure_private_dir(tmp_path / "pids")
    decoy = tmp_path / "decoy.json"
    decoy.write_text(json.dumps({"pid": os.getpid(), "socket": sys.executable}))  # would name this process
    (pids / "1.json").symlink_to(decoy)
    assert end_orphans(pids) == []
    assert list(pids.iterdir()) == [] and decoy.exists()


def listen_as_other_user(path: Path) -> socket.socket:
    """A listening socket at `path` owned by another user, as one that user could have put there."""
    need_root("makes a socket owned by another user")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(8)
    listener.setblocking(False)
    os.chown(path, OTHER_UID, OTHER_UID)
    return listener


def accepted(listener: socket.socket) -> bool:
    try:
        listener.accept()[0].close()
    except BlockingIOError:
        return False
    return True


# An engine whose socket is another user's: it is put in place, listening, already owned by that user, and
# every connection it accepts is written down.
FOREIGN_ENGINE = """
import os, socket, sys
path, seen, uid = sys.argv[1], sys.argv[2], int(sys.argv[3])
listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
listener.bind(path + ".tmp")
os.chown(path + ".tmp", uid, uid)
listener.listen(8)
os.rename(path + ".tmp", path)
while True:
    listener.accept()
    with open(seen, "a") as log:
        log.write("connected\\n")
"""


def test_a_socket_of_another_user_is_never_made_ready(tmp_path: Path) -> None:
    need_root("makes a socket owned by another user")
    seen = tmp_path / "connections"
    argv = [sys.executable, "-c", FOREIGN_ENGINE]
    engine = runner(tmp_path, argv)
    engine.spec.argv.extend([str(engine.socket), str(seen), str(OTHER_UID)])
    with pytest.raises(LoadError, match=f"belongs to uid {OTHER_UID}"):
        asyncio.run(engine.start())
    assert engine.gone.is_set() and not seen.exists()  # the engine ended; its socket never connected to


def test_the_relay_does_not_connect_to_a_socket_of_another_user(tmp_path: Path) -> None:
    path = ensure_private_dir(tmp_path / "run") / "runner-1.sock"
    listener = listen_as_other_user(path)
    try:
        with pytest.raises(PermissionError, match=f"belongs to uid {OTHER_UID}"):
            asyncio.run(EnginePool().connect(str(path)))
        assert not accepted(listener)
    finally:
        listener.close()


def test_an_engine_call_does_not_connect_to_a_socket_of_another_user(tmp_path: Path) -> None:
    """The ASGI path's way to the engine (server/upstream.py EngineCall), as the front's above."""
    path = ensure_private_dir(tmp_path / "run") / "runner-1.sock"
    listener = listen_as_other_user(path)
    exchange: Any = SimpleNamespace(opened=lambda close: None)
    runner: Any = SimpleNamespace(socket=path)
    try:
        with pytest.raises(EngineUnreachable, match=f"belongs to uid {OTHER_UID}"):
            asyncio.run(EngineCall(exchange, runner).send("/v1/models", b""))
        assert not accepted(listener)
    finally:
        listener.close()
