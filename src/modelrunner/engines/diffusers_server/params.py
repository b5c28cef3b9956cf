"""The `/v1/images/generations` request: DMR's fields, checked before any work (contract 6).

Bad values raise BadParameter (400); `model` naming another model raises WrongModel (421). Other fields
(`quality`, `style`, `user`, ...) are ignored, as DMR does, so OpenAI clients that send them still work.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

MIN_SIDE = 64
MAX_SIDE = 2048
MAX_IMAGES = 10
MAX_STEPS = 150
MIN_GUIDANCE, MAX_GUIDANCE = 1.0, 20.0
MAX_SEED = 2**63 - 1 - MAX_IMAGES  # image i uses seed + i, which must stay a valid torch seed
MAX_PROMPT_CHARS = 10_000
_SIZE = re.compile(r"([0-9]{1,5})x([0-9]{1,5})")


class BadParameter(Exception):
    pass


class WrongModel(Exception):
    pass


@dataclass(frozen=True)
class ImageRequest:
    prompt: str
    n: int = 1
    width: int = 512
    height: int = 512
    negative_prompt: str | None = None
    num_inference_steps: int = 50
    guidance_scale: float = 7.5
    seed: int | None = None


def canonical_name(name: str) -> str:
    """A model name as DMR reads it: `ai/` is the default namespace, `:latest` the default tag, Docker Hub
    the default registry. So `tiny`, `ai/tiny:latest` and `docker.io/ai/tiny` name one model."""
    text = name.strip().lower()
    for registry in ("index.docker.io/", "docker.io/", "registry-1.docker.io/"):
        if text.startswith(registry):
            text = text[len(registry) :]
            break
    if text.startswith("ai/"):
        text = text[3:]
    if text.endswith(":latest") and "@" not in text:
        text = text[: -len(":latest")]
    return text


def check_model(requested: object, served: Iterable[str]) -> None:
    if not isinstance(requested, str) or not requested.strip():
        raise BadParameter("model is required")
    if canonical_name(requested) not in {canonical_name(name) for name in served}:
        raise WrongModel(f"this runner serves another model than {requested[:200]!r}")


def _integer(body: Mapping[str, object], key: str, default: int, low: int, high: int) -> int:
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadParameter(f"{key} must be an integer from {low} to {high}")
    if not low <= value <= high:
        raise BadParameter(f"{key} must be from {low} to {high}, not {value}")
    return value


def parse_size(value: object) -> tuple[int, int]:
    """`WxH` with both sides multiples of 8 from MIN_SIDE to MAX_SIDE."""
    match = _SIZE.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        raise BadParameter(f"size must look like 512x512 (width x height), not {str(value)[:40]!r}")
    width, height = int(match.group(1)), int(match.group(2))
    for side in (width, height):
        if not MIN_SIDE <= side <= MAX_SIDE or side % 8:
            raise BadParameter(
                f"size {width}x{height}: each side must be a multiple of 8 from {MIN_SIDE} to {MAX_SIDE}"
            )
    return width, height


def parse_request(body: object) -> ImageRequest:
    """Every field except `model` (see check_model), with DMR's defaults and bounds."""
    if not isinstance(body, dict):
        raise BadParameter("the request body must be a JSON object")
    prompt = body.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise BadParameter("prompt is required and must be a non-empty string")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise BadParameter(f"prompt is longer than {MAX_PROMPT_CHARS} characters")
    negative = body.get("negative_prompt")
    if negative is not None and not isinstance(negative, str):
        raise BadParameter("negative_prompt must be a string")
    response_format = body.get("response_format") or "b64_json"
    if response_format != "b64_json":
        raise BadParameter("response_format must be b64_json: this server does not host image URLs")
    guidance = body.get("guidance_scale", 7.5)
    if guidance is None:
        guidance = 7.5
    if isinstance(guidance, bool) or not isinstance(guidance, int | float):
        raise BadParameter(f"guidance_scale must be a number from {MIN_GUIDANCE:g} to {MAX_GUIDANCE:g}")
    if not MIN_GUIDANCE <= guidance <= MAX_GUIDANCE:
        raise BadParameter(
            f"guidance_scale must be from {MIN_GUIDANCE:g} to {MAX_GUIDANCE:g}, not {guidance}"
        )
    seed = body.get("seed")
    if seed is not None:
        seed = _integer(body, "seed", 0, 0, MAX_SEED)
    width, height = parse_size(body.get("size") or "512x512")
    return ImageRequest(
        prompt=prompt,
        n=_integer(body, "n", 1, 1, MAX_IMAGES),
        width=width,
        height=height,
        negative_prompt=negative or None,
        num_inference_steps=_integer(body, "num_inference_steps", 50, 1, MAX_STEPS),
        guidance_scale=float(guidance),
        seed=seed,
    )
