"""What `/api/create` keeps of a model beyond its DMR artifact: Ollama's `system` prompt and `parameters` (a
Modelfile's SYSTEM and PARAMETER lines, the "custom persona" of Ollama's tutorials), applied by the Ollama
routes to requests naming that model (compat/ollama.py `with_persona`).

A DMR artifact has no place for them (a system prompt and sampling defaults are per request there), and
`FROM a` with only these changes builds the very model `a` is: so they are kept per tag, with the model ID
the tag named, in the store's `ollama-personas.json`. A tag that names another model since (`tag`, `rm`,
a pull) has lost its persona; `/api/delete` and `/api/copy` remove and copy it as Ollama's do.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from modelrunner.errors import InvalidReference
from modelrunner.fileio import write_file_atomic
from modelrunner.store.store import ModelStore, StoredModel, full_tag

FILE_NAME = "ollama-personas.json"
_LOCK = threading.Lock()  # the create router and the Ollama routes each have a Personas of the store


@dataclass(frozen=True)
class Persona:
    model_id: str
    system: str | None = None
    parameters: dict[str, Any] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.system) or bool(self.parameters)


NONE = Persona("")


class Personas:
    """The personas of a store's tags, in one small JSON file: {tag: {model_id, system, parameters}}."""

    def __init__(self, store: ModelStore) -> None:
        self.path: Path = store.layout.root / FILE_NAME

    def _read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_bytes())
        except (FileNotFoundError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _write(self, data: dict[str, Any]) -> None:
        write_file_atomic(self.path, json.dumps(data, indent=1, sort_keys=True).encode())

    def of(self, name: str, model: StoredModel) -> Persona:
        """The persona of the model a request names (NONE unless that tag was created with one)."""
        try:
            entry = self._read().get(full_tag(name))
        except InvalidReference:  # an ID: IDs have no persona
            return NONE
        if not isinstance(entry, dict) or entry.get("model_id") != model.id:
            return NONE
        system = entry.get("system")
        parameters = entry.get("parameters")
        return Persona(
            model.id,
            system if isinstance(system, str) else None,
            parameters if isinstance(parameters, dict) else {},
        )

    def put(self, tag: str, persona: Persona) -> None:
        """`tag`'s persona from now on (none: forgotten, as a create without one replaces the model)."""
        with _LOCK:
            data = self._read()
            had = data.pop(full_tag(tag), None)
            if persona:
                data[full_tag(tag)] = {
                    "model_id": persona.model_id,
                    "system": persona.system,
                    "parameters": persona.parameters,
                }
            if persona or had is not None:
                self._write(data)

    def forget(self, tag: str) -> None:
        self.put(tag, NONE)

    def copy(self, source: str, destination: str, model: StoredModel) -> None:
        self.put(destination, self.of(source, model))
