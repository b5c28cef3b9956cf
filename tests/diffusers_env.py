"""The real diffusers environment for tests, and a tiny Stable Diffusion pipeline packaged as DDUF.

`diffusers_python` is session-scoped and never skips: it takes the installer's cached environment, creating
it first on a fresh machine (~1-2 min of pip, once; scripts/test does it before the tests). The pipeline is
built by the environment's own python (the project venv has no torch): random weights, the tiny configs of
diffusers' own tests, a byte-level CLIP tokenizer made in code, so nothing is downloaded. It is ~370 KB and
makes a 64x64 image in 2 steps in well under a second. Tests ask for both by parameter name
(tests/conftest.py registers this module as a plugin).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from modelrunner.engines import diffusers

_TINY_SD_BUILDER = r"""
import sys, tempfile
from pathlib import Path

import torch
from diffusers import AutoencoderKL, DDIMScheduler, StableDiffusionPipeline, UNet2DConditionModel
from huggingface_hub import export_folder_as_dduf
from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer


def byte_level_alphabet():
    # GPT-2/CLIP byte-to-unicode: printable bytes stand for themselves, the others map past U+0100.
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    shifted = iter(range(0x100, 0x200))
    return [chr(b) if b in printable else chr(next(shifted)) for b in range(256)]


torch.manual_seed(0)
unet = UNet2DConditionModel(
    block_out_channels=(4, 8), layers_per_block=1, sample_size=32, in_channels=4, out_channels=4,
    down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
    up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), cross_attention_dim=32, norm_num_groups=2,
)
scheduler = DDIMScheduler(
    beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", clip_sample=False,
    set_alpha_to_one=False, steps_offset=1,
)
vae = AutoencoderKL(
    block_out_channels=[4, 8], in_channels=3, out_channels=3, down_block_types=["DownEncoderBlock2D"] * 2,
    up_block_types=["UpDecoderBlock2D"] * 2, latent_channels=4, norm_num_groups=2,
)
text_encoder = CLIPTextModel(CLIPTextConfig(
    bos_token_id=0, eos_token_id=2, hidden_size=32, intermediate_size=37, layer_norm_eps=1e-5,
    num_attention_heads=4, num_hidden_layers=2, pad_token_id=1, vocab_size=1000,
))
alphabet = byte_level_alphabet()
tokens = ["<|startoftext|>", "<|endoftext|>", *alphabet, *(c + "</w>" for c in alphabet)]
tokenizer = CLIPTokenizer(vocab={t: i for i, t in enumerate(tokens)}, merges=[], model_max_length=77)
pipe = StableDiffusionPipeline(
    unet=unet, scheduler=scheduler, vae=vae, text_encoder=text_encoder, tokenizer=tokenizer,
    safety_checker=None, feature_extractor=None, requires_safety_checker=False,
)
with tempfile.TemporaryDirectory() as folder:
    pipe.save_pretrained(folder)
    export_folder_as_dduf(Path(sys.argv[1]), folder)
"""


@pytest.fixture(scope="session")
def diffusers_python() -> Path:
    """The python of the cached CPU diffusers environment (torch 2.13.0, diffusers 0.42.1, ...)."""
    env = diffusers.ensure_env("cpu", lambda line: print(line, flush=True))
    return env / "bin" / "python"


def write_tiny_sd_dduf(python: Path, path: Path) -> Path:
    """A loadable random-weight Stable Diffusion pipeline as a DDUF file, written by `python`."""
    result = subprocess.run(
        [str(python), "-c", _TINY_SD_BUILDER, str(path)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    if result.returncode != 0:
        raise RuntimeError(f"building the tiny pipeline failed:\n{result.stderr[-3000:]}")
    return path


@pytest.fixture(scope="session")
def tiny_sd_dduf(diffusers_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_sd_dduf(diffusers_python, tmp_path_factory.mktemp("tiny-sd") / "tiny-sd.dduf")
