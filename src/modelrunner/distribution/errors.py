"""Errors of talking to registries, on top of the project's hierarchy (statuses as DMR answers them)."""

from __future__ import annotations

import socket

from modelrunner.errors import ModelRunnerError


class RegistryUnauthorized(ModelRunnerError):
    """The registry (or its token service) refused our credentials, or wants some."""

    status_code = 401


class RegistryForbidden(ModelRunnerError):
    status_code = 403


class RegistryUnavailable(ModelRunnerError):
    """Network errors and 5xx answers that outlasted the retries."""

    status_code = 502


def unreachable(what: str, exc: BaseException) -> RegistryUnavailable:
    """`what` ("the registry docker.io") could not be reached, in words: a failed name lookup (the usual
    cause: no network) is said as one, not as the resolver's errno ("[Errno -3] Temporary failure in name
    resolution"); other network errors keep their text."""
    cause: BaseException | None = exc
    while cause is not None and not isinstance(cause, socket.gaierror):
        cause = cause.__cause__ or cause.__context__
    if cause is not None:
        reason = "its name could not be looked up (is this machine offline?)"
    else:
        reason = (str(exc) or type(exc).__name__)[:200]
    return RegistryUnavailable(f"{what} could not be reached: {reason}")


class UnsafeRedirect(ModelRunnerError):
    """A redirect or token realm pointing somewhere we refuse to go (private address, downgrade)."""

    status_code = 502


class TransferCancelled(ModelRunnerError):
    """Every client of a pull went away; partial files stay for a later resume."""

    status_code = 499
