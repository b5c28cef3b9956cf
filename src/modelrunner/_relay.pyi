# The C relay thread (_relay.c); its Python side is server/native_relay.py.

def start() -> int: ...
def add(
    client_fd: int,
    engine_fd: int,
    tail: bytes,
    record: bool,
    head_limit: int,
    tail_limit: int,
    idle: float,
    ping: bytes,
    ping_every: float,
    /,
) -> int: ...
def cancel(stream: int, /) -> None: ...
def results() -> list[tuple[int, int, int, int, int, float, bytes, bytes, bytes, str | None]]: ...
