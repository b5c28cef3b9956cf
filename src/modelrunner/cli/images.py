"""`model run IMAGE_MODEL "prompt"`: generate an image with a DDUF model and write it as a PNG file.

DMR's `run` does not do images; here a DDUF model's `run` posts to `/engines/diffusers/v1/images/generations`
and writes each returned PNG, printing its path.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import re
import sys
import threading
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


def _generate(
    daemon: Client, model: str, payload: dict[str, Any], headers: dict[str, str] | None = None
) -> Any:
    """POST to the image route, installing the diffusers engine on first use and saying, on stderr, when
    the model is still loading (a pipeline takes a while to load: not a hang)."""
    from modelrunner.cli.answer import loading_notice
    from modelrunner.cli.engines import with_engine_installed

    notice = loading_notice(daemon, model)
    try:
        return with_engine_installed(
            daemon, lambda: daemon.call("POST", ROUTE, payload=payload, headers=headers or {})
        )
    finally:
        notice.cancel()


# The engine's log line after each denoising step (engines/diffusers_server/pipeline.py STEP_LINE)
_STEP = re.compile(rb"diffusers server: step (\d+)/(\d+)")


class StepProgress:
    """Shows the denoising steps on stderr as the engine logs them (`model logs --model M -f`): the step
    lines already in the log are counted first and skipped, so only this request's are shown. Progress
    is a courtesy: a log that cannot be read shows none, and nothing fails."""

    def __init__(self, daemon: Client, model: str) -> None:
        self.daemon, self.model = daemon, model
        self.tty = sys.stderr.isatty()
        self.shown = (0, 0)
        self.done = threading.Event()
        self.caught_up = threading.Event()  # the last step shown
        try:
            self.skip = len(_STEP.findall(b"".join(daemon.logs(False, False, model))))
        except Exception:  # no log route (an older runner), no access: no progress
            self.skip = -1
            return
        threading.Thread(target=self._follow, daemon=True).start()

    def _follow(self) -> None:
        seen, pending = 0, b""
        try:
            for chunk in self.daemon.logs(True, False, self.model):
                *lines, pending = (pending + chunk).split(b"\n")
                for line in lines:
                    found = _STEP.search(line)
                    if found is None:
                        continue
                    seen += 1
                    if seen > self.skip and not self.done.is_set():
                        self._show(int(found[1]), int(found[2]))
                if self.done.is_set():
                    return
        except Exception:
            return

    def _show(self, step: int, steps: int) -> None:
        text = f"Step {step}/{steps}"
        print(f"\r{text}" if self.tty else text, end="" if self.tty else "\n", file=sys.stderr, flush=True)
        self.shown = (step, steps)
        if step == steps:
            self.caught_up.set()

    def finish(self) -> None:
        """After the answer: let the log's last steps reach the screen (a second at most), then stop."""
        if self.skip >= 0:
            self.caught_up.wait(1.0)
        self.done.set()
        if self.tty and self.shown[0]:
            print(file=sys.stderr, flush=True)


def _what_is_made(payload: dict[str, Any]) -> str:
    """`an image of 512x512, 20 steps`, as far as the request says (the engine's defaults otherwise)."""
    details = [str(payload["size"])] if "size" in payload else []
    if "num_inference_steps" in payload:
        details.append(f"{payload['num_inference_steps']} steps")
    else:
        details.append("the engine's default steps")
    if "seed" in payload:
        details.append(f"seed {payload['seed']}")
    return "an image (" + ", ".join(details) + ")"


def run_image(daemon: Client, args: argparse.Namespace) -> int:
    if args.detach:
        _generate(daemon, args.model, {"model": args.model, "prompt": "preload"}, {"X-Preload-Only": "true"})
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
    # stderr says what happens (loading, then minutes of denoising on a CPU); stdout keeps only the paths
    print(f"Generating {_what_is_made(payload)} with {args.model}...", file=sys.stderr, flush=True)
    started = time.monotonic()
    progress = StepProgress(daemon, args.model)
    try:
        answer = _generate(daemon, args.model, payload)
    except BaseException:
        progress.done.set()
        raise
    progress.finish()
    images = decode_images(answer)
    from modelrunner.fileio import write_file_atomic

    paths = output_paths(args.output, len(images))
    for path, png in zip(paths, images, strict=True):
        write_file_atomic(path, png)
        print(path)
    took = time.monotonic() - started
    print(f"Wrote {', '.join(map(str, paths))} in {took:.1f}s", file=sys.stderr, flush=True)
    return 0


# The flags that only an image model reads: on a chat model they are said to be ignored
IMAGE_FLAGS = (("output", "-o/--output"), ("size", "--size"), ("steps", "--steps"), ("seed", "--seed"))


def warn_image_flags_ignored(args: argparse.Namespace) -> None:
    """`run CHAT_MODEL -o out.png` would otherwise drop -o without a word."""
    given = [flag for attribute, flag in IMAGE_FLAGS if getattr(args, attribute, None) is not None]
    if given:
        print(
            f"{', '.join(given)}: only for image models; {args.model} answers in text, so "
            f"{'it is' if len(given) == 1 else 'they are'} ignored",
            file=sys.stderr,
            flush=True,
        )
