"""The diffusers pipeline: loading an unpacked DDUF folder and turning requests into PNG bytes."""

from __future__ import annotations

import inspect
import io
import threading
from pathlib import Path
from typing import Any

import torch
from diffusers import DiffusionPipeline

from .params import ImageRequest


def pick_device(requested: str) -> tuple[str, Any]:
    """(device, dtype): CUDA in fp16 when there is one (or it is asked for), else the CPU in fp32."""
    if requested == "cuda" or (requested == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise RuntimeError("--device cuda was asked for, but torch sees no CUDA device")
        return "cuda", torch.float16
    return "cpu", torch.float32  # fp16 on CPU is slow and some kernels lack it


class Cancelled(Exception):
    """The request's client left: its image is not finished."""


# A line per denoising step in the engine's log, which `model run` follows to show the progress
STEP_LINE = "diffusers server: step {step}/{steps}"


def _on_step_end(cancelled: threading.Event | None, steps: int) -> Any:
    """After each denoising step: say it in the log, and stop (Cancelled) once the client has left."""

    def on_step_end(pipe: Any, step: int, timestep: Any, tensors: dict[str, Any]) -> dict[str, Any]:
        if cancelled is not None and cancelled.is_set():
            raise Cancelled("the client left")
        total = getattr(pipe, "num_timesteps", None) or steps  # a scheduler may take more than asked
        print(STEP_LINE.format(step=step + 1, steps=total), flush=True)
        return tensors

    return on_step_end


class ImagePipeline:
    def __init__(self, folder: Path, device: str = "auto") -> None:
        self.device, dtype = pick_device(device)
        # Safety checker off (DMR does the same): a random-weight or community pipeline may lack one, and
        # a model the user chose to run is theirs to judge.
        self.pipe: Any = DiffusionPipeline.from_pretrained(
            str(folder),
            dtype=dtype,
            local_files_only=True,
            safety_checker=None,
            requires_safety_checker=False,
        )
        self.pipe.to(self.device)
        self.pipe.set_progress_bar_config(disable=True)
        if self.device == "cuda" and hasattr(self.pipe, "enable_attention_slicing"):
            self.pipe.enable_attention_slicing()  # lower peak memory at large sizes

    def generate(self, request: ImageRequest, cancelled: threading.Event | None = None) -> list[bytes]:
        """One PNG per image, made one pipeline call at a time; image i uses seed + i. Once `cancelled`
        is set (the client left) the work stops at the next denoising step: Cancelled is raised."""
        images = []
        each_step: dict[str, Any] = {}
        if "callback_on_step_end" in inspect.signature(self.pipe.__call__).parameters:
            each_step["callback_on_step_end"] = _on_step_end(cancelled, request.num_inference_steps)
        for i in range(request.n):
            if cancelled is not None and cancelled.is_set():
                raise Cancelled("the client left")
            generator = None
            if request.seed is not None:
                # A CPU generator gives the same noise on every device, so a seed means one picture.
                generator = torch.Generator(device="cpu").manual_seed(request.seed + i)
            with torch.inference_mode():
                result = self.pipe(
                    prompt=request.prompt,
                    negative_prompt=request.negative_prompt,
                    width=request.width,
                    height=request.height,
                    num_inference_steps=request.num_inference_steps,
                    guidance_scale=request.guidance_scale,
                    num_images_per_prompt=1,
                    generator=generator,
                    output_type="pil",
                    **each_step,
                )
            buffer = io.BytesIO()
            result.images[0].save(buffer, format="PNG")
            images.append(buffer.getvalue())
        return images
