"""Settings for an engine's unit tests, given flat: each field goes to the engine's own settings type
(`Engine.settings_type`) when it is one of its fields, to RunnerSettings otherwise."""

from __future__ import annotations

import dataclasses
from typing import Any

from modelrunner.engines.base import RunnerSettings
from modelrunner.engines.settings import EngineSettings


def runner_settings(kind: type[EngineSettings], **settings: Any) -> RunnerSettings:
    own_fields = {f.name for f in dataclasses.fields(kind)}
    own = {k: v for k, v in settings.items() if k in own_fields}
    common = {k: v for k, v in settings.items() if k not in own_fields}
    return RunnerSettings(**common, engines=(kind(**own),) if own else ())
