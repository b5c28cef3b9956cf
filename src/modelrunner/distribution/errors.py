"""Errors of talking to registries, on top of the project's hierarchy (statuses as DMR answers them)."""

from __future__ import annotations

from modelrunner.errors import ModelRunnerError


class RegistryUnauthorized(ModelRunnerError):
    """The registry (or its token service) refused our credentials, or wants some."""

    status_code = 401


class RegistryForbidden(ModelRunnerError):
    status_code = 403


class RegistryUnavailable(ModelRunnerError):
    """Network errors and 5xx answers that outlasted the retries."""

    status_code = 502


class UnsafeRedirect(ModelRunnerError):
    """A redirect or token realm pointing somewhere we refuse to go (private address, downgrade)."""

    status_code = 502


class TransferCancelled(ModelRunnerError):
    """Every client of a pull went away; partial files stay for a later resume."""

    status_code = 499
