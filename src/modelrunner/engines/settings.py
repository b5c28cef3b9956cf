"""What an engine's own settings look like: each engine declares a typed model (`Engine.settings_type`, as
RamaLama's runtime plug-ins own their `config_type`), and nothing above the engines knows its keys.

A settings type has three jobs: read and check its object of DMR's configure request (`llamacpp`, `vllm`:
`pkg/inference/backend.go` BackendConfiguration), write it back in that shape, and hand the engine what it
builds its command line from. It is stored flat in the model's configuration file (its field names).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar, Self, TypeVar


@dataclasses.dataclass(frozen=True)
class EngineSettings:
    """An engine without settings of its own; subclasses add fields (all defaulted: the default is unset)."""

    # The name of its object in DMR's configure request and BackendConfiguration; None: it has none.
    key: ClassVar[str | None] = None

    @classmethod
    def from_request(cls, value: Mapping[str, Any], engine: str) -> Self:
        """The object of a configure request, checked (BadRequest says what is wrong); `engine`: the engine
        that runs the model, for the keys that only it may set."""
        return cls()

    def configuration(self) -> dict[str, Any]:
        """The object as DMR's BackendConfiguration writes it: its keys, unset ones left out (omitempty)."""
        return {}

    def to_json(self) -> dict[str, Any]:
        """The stored form: the set fields by name."""
        return {
            f.name: list(value) if isinstance(value, tuple) else value
            for f in dataclasses.fields(self)
            if (value := getattr(self, f.name)) not in (None, [], ())
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        """The stored form back, from a configuration's flat keys (the other keys are not its own)."""
        mine = {f.name: data[f.name] for f in dataclasses.fields(cls) if f.name in data}
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in mine.items()})

    @property
    def is_default(self) -> bool:
        return self == type(self)()

    @property
    def saves_prompt_cache(self) -> bool:
        """False when these settings turn warm resume (saving the prompt cache) off."""
        return True


S = TypeVar("S", bound=EngineSettings)


def settings_of(found: Iterable[EngineSettings], kind: type[S]) -> S:
    """The settings of type `kind` among `found`; its defaults when none is there."""
    return next((s for s in found if isinstance(s, kind)), None) or kind()


def is_number(value: Any, kind: Any) -> bool:
    """A JSON number of `kind` (int, float), not a boolean (which Python counts as an int)."""
    return isinstance(value, kind) and not isinstance(value, bool)
