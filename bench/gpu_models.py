"""Random-weight models of realistic shape for the offline GPU run (bench/gpu_check.py --offline): nothing
can be downloaded there, and the tests' tiny models say nothing about a GPU's speed.

* a Llama-3.2-1B-shaped GGUF (16 layers, n_embd 2048, n_ff 8192, 32/8 heads, vocab 128256, tied output) in
  F16 or Q4_K. Q4_K data is random blocks with sane scales (engines/llamacpp_smoke.py's trick: gguf-py cannot
  quantize to K-quants). The vocabulary is the tests' SPM one padded with made-up pieces to 128256: the
  output matrix, not the tokenizer, is what costs;
* a Stable-Diffusion-1.5-shaped pipeline (UNet 860M, VAE, CLIP ViT-L text encoder) built from configs by the
  diffusers engine's python on the GPU, in fp16, packaged as DDUF.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter, LlamaFileType, TokenType

from modelrunner.engines.llamacpp_smoke import _q4_k_blocks
from tests.models import spm_vocab

N_LAYER = 16
N_EMBD = 2048
N_FF = 8192
N_HEAD = 32
N_HEAD_KV = 8
HEAD_DIM = N_EMBD // N_HEAD
N_VOCAB = 128256
ROPE_THETA = 500000.0
FILE_TYPES = {"F16": LlamaFileType.MOSTLY_F16, "Q4_K": LlamaFileType.MOSTLY_Q4_K_M}


def vocabulary() -> tuple[list[str], list[float], list[int]]:
    tokens, scores, types = spm_vocab()
    extra = N_VOCAB - len(tokens)
    return (
        tokens + [f"▁t{i}" for i in range(extra)],
        scores + [-float(len(scores) + i) for i in range(extra)],
        types + [int(TokenType.NORMAL)] * extra,
    )


def matrices() -> dict[str, tuple[int, int]]:
    """llama.cpp's llama tensors (numpy shapes, rows = output features); no output.weight: tied, as in
    Llama 3.2 1B."""
    shapes = {"token_embd.weight": (N_VOCAB, N_EMBD)}
    for i in range(N_LAYER):
        shapes |= {
            f"blk.{i}.attn_q.weight": (N_HEAD * HEAD_DIM, N_EMBD),
            f"blk.{i}.attn_k.weight": (N_HEAD_KV * HEAD_DIM, N_EMBD),
            f"blk.{i}.attn_v.weight": (N_HEAD_KV * HEAD_DIM, N_EMBD),
            f"blk.{i}.attn_output.weight": (N_EMBD, N_HEAD * HEAD_DIM),
            f"blk.{i}.ffn_gate.weight": (N_FF, N_EMBD),
            f"blk.{i}.ffn_up.weight": (N_FF, N_EMBD),
            f"blk.{i}.ffn_down.weight": (N_EMBD, N_FF),
        }
    return shapes


POOL = 1 << 24  # F16 weights are drawn once and repeated from random offsets: 2.5 GB in seconds, not minutes


def random_matrix(
    rows: int, columns: int, weight_type: str, rng: np.random.Generator, pool: np.ndarray[Any, Any]
) -> np.ndarray[Any, Any]:
    if weight_type == "Q4_K":
        return _q4_k_blocks(rows, columns, rng)
    start = int(rng.integers(0, pool.size))
    return np.resize(pool[start:], (rows, columns))


def write_llama_1b_gguf(path: Path, weight_type: str, context_length: int, seed: int = 0) -> Path:
    """A Llama-3.2-1B-shaped GGUF of random weights: 2.5 GB in F16, 0.7 GB in Q4_K."""
    rng = np.random.default_rng(seed)
    tokens, scores, types = vocabulary()
    writer = GGUFWriter(path, "llama")
    writer.add_name(f"llama-3.2-1b-shaped-{weight_type.lower()}")
    writer.add_file_type(FILE_TYPES[weight_type])
    writer.add_context_length(context_length)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(N_LAYER)
    writer.add_feed_forward_length(N_FF)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_rope_freq_base(ROPE_THETA)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD_KV)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    qtype = GGMLQuantizationType[weight_type]
    pool = (rng.standard_normal(POOL, dtype=np.float32) * 0.02).astype(np.float16)
    for name, (rows, columns) in matrices().items():
        data = random_matrix(rows, columns, weight_type, rng, pool)
        writer.add_tensor(name, data, raw_dtype=qtype if weight_type == "Q4_K" else None)
    for i in range(N_LAYER):  # norms stay F32, as in real files; ones keep activations sane
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    writer.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# Stable Diffusion 1.5's configs (its model card's unet/vae/text_encoder config.json, defaults left out),
# random weights made on the GPU; the tokenizer is tests/diffusers_env.py's byte-level one (ids < 49408).
_SD15_BUILDER = r"""
import sys, tempfile
from pathlib import Path

import torch
from diffusers import AutoencoderKL, DDIMScheduler, StableDiffusionPipeline, UNet2DConditionModel
from huggingface_hub import export_folder_as_dduf
from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer


def byte_level_alphabet():
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    shifted = iter(range(0x100, 0x200))
    return [chr(b) if b in printable else chr(next(shifted)) for b in range(256)]


torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
small = sys.argv[2] == "small"  # the dry run's CPU: the same code, channels cut
channels = (32, 64, 64, 64) if small else (320, 640, 1280, 1280)
with torch.device(device):
    unet = UNet2DConditionModel(
        sample_size=64, cross_attention_dim=768, attention_head_dim=8, block_out_channels=channels,
        norm_num_groups=32,
    )
    vae = AutoencoderKL(
        block_out_channels=[32, 64, 64, 64] if small else [128, 256, 512, 512], latent_channels=4,
        down_block_types=["DownEncoderBlock2D"] * 4, up_block_types=["UpDecoderBlock2D"] * 4,
        layers_per_block=2, sample_size=512,
    )
    text_encoder = CLIPTextModel(CLIPTextConfig(
        hidden_size=768, intermediate_size=3072, num_attention_heads=12, num_hidden_layers=2 if small else 12,
        projection_dim=768, vocab_size=49408, max_position_embeddings=77, hidden_act="quick_gelu",
        bos_token_id=0, eos_token_id=2, pad_token_id=1,
    ))
scheduler = DDIMScheduler(
    beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", clip_sample=False,
    set_alpha_to_one=False, steps_offset=1,
)
alphabet = byte_level_alphabet()
tokens = ["<|startoftext|>", "<|endoftext|>", *alphabet, *(c + "</w>" for c in alphabet)]
tokenizer = CLIPTokenizer(vocab={t: i for i, t in enumerate(tokens)}, merges=[], model_max_length=77)
pipe = StableDiffusionPipeline(
    unet=unet, scheduler=scheduler, vae=vae, text_encoder=text_encoder, tokenizer=tokenizer,
    safety_checker=None, feature_extractor=None, requires_safety_checker=False,
)
pipe.to(torch.float16)
with tempfile.TemporaryDirectory() as folder:
    pipe.save_pretrained(folder)
    export_folder_as_dduf(Path(sys.argv[1]), folder)
print(sum(p.numel() for p in unet.parameters()))
"""


def write_sd15_dduf(python: Path, path: Path, small: bool = False) -> dict[str, int]:
    """The SD-1.5-shaped pipeline as DDUF, written by `python` (an environment with torch and diffusers);
    its UNet's parameter count."""
    result = subprocess.run(
        [str(python), "-c", _SD15_BUILDER, str(path), "small" if small else "full"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    if result.returncode != 0:
        raise RuntimeError(f"building the SD-shaped pipeline failed:\n{result.stderr[-3000:]}")
    return {"unet_parameters": int(result.stdout.split()[-1]), "bytes": path.stat().st_size}
