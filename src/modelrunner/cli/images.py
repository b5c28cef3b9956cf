"""`model run IMAGE_MODEL "prompt"`: generate an image with a DDUF model and write it as a PNG file.

DMR's `run` does not do images; here a DDUF model's `run` posts to `/engines/diffusers/v1/images/generations`
and writes each returned PNG, printing its path.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from modelrunner.cli.common import UsageError

if TYPE_CHECKING:
    from modelrunner.client import Client
    from modelrunner.client_types import Model

ROUTE = "/engines/diffusers/v1/images/generations"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def is_image_model(model: Model) -> bool:
    return model.config.get("format") in ("dduf", "diffusers")


def output_paths(output: str | None, count: int) -> list[Path]:
    """`-o out.png` as given for one image, `out-1.png`, `out-2.png`, ... for several; a timestamped
    name in the current folder by default, so an earlier image is never overwritten unasked."""
    base = Path(output) if output else Path(f"image-{time.strftime('%Y%m%d-%H%M%S')}.png")
    if count == 1:
        return [base]
    return [base.with_name(f"{base.stem}-{i}{base.suffix or '.png'}") for i in range(1, count + 1)]


def decode_images(answer: object) -> list[bytes]:
    data = answer.get("data") if isinstance(answer, dict) else None
    if not isinstance(data, list) or not data:
        raise SystemExit("Error: the engine answered without images")
    images = []
    for item in data:
        try:
            png = base64.b64decode(item["b64_json"], validate=True)
        except (KeyError, TypeError, binascii.Error):
            raise SystemExit("Error: the engine answered with an image that is not base64") from None
        if not png.startswith(PNG_SIGNATURE):
            raise SystemExit("Error: the engine answered with an image that is not a PNG")
        images.append(png)
    return images


def run_image(daemon: Client, args: argparse.Namespace) -> int:
    if args.detach:
        daemon.call(
            "POST",
            ROUTE,
            payload={"model": args.model, "prompt": "preload"},
            headers={"X-Preload-Only": "true"},
        )
        return 0
    prompt = " ".join(args.prompt)
    if not sys.stdin.isatty():
        piped = sys.stdin.read()
        prompt = f"{prompt}\n\n{piped}".strip() if prompt else piped.strip()
    if not prompt:
        raise UsageError(f'{args.model} makes images: give a prompt, e.g. model run {args.model} "a red fox"')
    payload: dict[str, Any] = {"model": args.model, "prompt": prompt, "response_format": "b64_json"}
    if args.size is not None:
        payload["size"] = args.size
    if args.steps is not None:
        payload["num_inference_steps"] = args.steps
    if args.seed is not None:
        payload["seed"] = args.seed
    images = decode_images(daemon.call("POST", ROUTE, payload=payload))
    from modelrunner.fileio import write_file_atomic

    for path, png in zip(output_paths(args.output, len(images)), images, strict=True):
        write_file_atomic(path, png)
        print(path)
    return 0
