"""Builders of tiny, valid model files for tests (GGUF, safetensors, DDUF), plus hostile DDUF variants.

Everything is written locally and deterministically: no network, no torch. The tiny GGUF follows the recipe in
shared/reference/dependencies.md so that a real llama-server can load it (its output text is random bytes:
assert on shapes and counts, never on text).
"""

from __future__ import annotations

import json
import math
import struct
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFWriter, LlamaFileType, TokenType
from huggingface_hub import export_entries_as_dduf

# Tiny llama hyper-parameters, shared by the GGUF and safetensors builders.
N_EMBD = 64
N_LAYER = 2
N_HEAD = 4
N_HEAD_KV = 2
N_FF = 128
HEAD_DIM = N_EMBD // N_HEAD
RMS_EPS = 1e-5

# Renders `tools` (as llama-server's /props then says: chat_template_caps.supports_tools), so that requests
# with tools reach the engine; server/capabilities.py refuses them for a template that does not.
CHAT_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}<|im_end|>\n"
    "{% endif %}"
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# A reasoning model's template, as Qwen3's renders thinking: a past turn's `reasoning_content` in
# `<think>...</think>` before its text, and a generation prompt that opens `<think>` unless thinking is off.
# llama-server's template analysis (b11434 common/chat-diff-analyzer.cpp) reads `<think>\n` / `</think>` as
# its reasoning markers and the prompt as thinking forced open: what the tiny model writes is reasoning
# until it writes `</think>` (it never does), a thinking block on the Messages API.
THINKING_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['role'] == 'assistant' and message['reasoning_content'] is defined"
    " and message['reasoning_content'] %}"
    "<think>\n{{ message['reasoning_content'] }}\n</think>\n\n{% endif %}"
    "{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is not defined or enable_thinking %}<think>\n{% endif %}{% endif %}"
)

# SPM pieces after the control and byte tokens; "▁" marks a leading space in sentencepiece vocabularies.
_SPM_PIECES = [
    "▁",
    *"abcdefghijklmnopqrstuvwxyz",
    *"0123456789",
    ".",
    ",",
    "!",
    "?",
    "▁the",
    "▁a",
    "▁is",
    "▁hello",
    "▁world",
]


def spm_vocab() -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores and token types of the tiny SPM ("llama") vocabulary."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + _SPM_PIECES
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL] + [TokenType.BYTE] * 256
    types += [TokenType.NORMAL] * len(_SPM_PIECES)
    scores = [0.0] * 259 + [-float(i) for i in range(len(_SPM_PIECES))]
    return tokens, scores, [int(t) for t in types]


def tiny_llama_tensor_shapes(n_vocab: int) -> dict[str, tuple[int, ...]]:
    """Tensor names and numpy shapes (rows first; GGUF stores dims reversed) of llama.cpp's llama arch."""
    shapes: dict[str, tuple[int, ...]] = {
        "token_embd.weight": (n_vocab, N_EMBD),
        "output_norm.weight": (N_EMBD,),
        "output.weight": (n_vocab, N_EMBD),
    }
    for i in range(N_LAYER):
        shapes |= {
            f"blk.{i}.attn_norm.weight": (N_EMBD,),
            f"blk.{i}.attn_q.weight": (N_HEAD * HEAD_DIM, N_EMBD),
            f"blk.{i}.attn_k.weight": (N_HEAD_KV * HEAD_DIM, N_EMBD),
            f"blk.{i}.attn_v.weight": (N_HEAD_KV * HEAD_DIM, N_EMBD),
            f"blk.{i}.attn_output.weight": (N_EMBD, N_HEAD * HEAD_DIM),
            f"blk.{i}.ffn_norm.weight": (N_EMBD,),
            f"blk.{i}.ffn_gate.weight": (N_FF, N_EMBD),
            f"blk.{i}.ffn_down.weight": (N_EMBD, N_FF),
            f"blk.{i}.ffn_up.weight": (N_FF, N_EMBD),
        }
    return shapes


def _random_weights(shapes: Mapping[str, tuple[int, ...]], seed: int) -> dict[str, np.ndarray[Any, Any]]:
    rng = np.random.default_rng(seed)
    weights: dict[str, np.ndarray[Any, Any]] = {}
    for name, shape in shapes.items():
        if len(shape) == 1:  # norm weights: ones keep activations sane
            weights[name] = np.ones(shape, dtype=np.float32)
        else:
            weights[name] = (rng.standard_normal(shape) * 0.02).astype(np.float32)
    return weights


def _ending_at_once(weights: dict[str, np.ndarray[Any, Any]]) -> dict[str, np.ndarray[Any, Any]]:
    """Weights whose every answer is end-of-text at once: each token's embedding is the same vector, the
    blocks add nothing to it (zero attention and feed-forward outputs), and the output row of `</s>` (id 2)
    points along it, so its logit (~32) dwarfs every other (~0.2) whatever the prompt and the sampling."""
    ending = dict(weights)
    ending["token_embd.weight"] = np.full_like(weights["token_embd.weight"], 0.1)
    for name in weights:
        if name.endswith(("attn_output.weight", "ffn_down.weight")):
            ending[name] = np.zeros_like(weights[name])
    output = weights["output.weight"].copy()
    output[2] = 0.5
    ending["output.weight"] = output
    return ending


def _tiny_llama_writer(
    path: Path,
    context_length: int,
    chat_template: bool,
    seed: int,
    split_max_tensors: int = 0,
    ends_at_once: bool = False,
) -> GGUFWriter:
    tokens, scores, types = spm_vocab()
    writer = GGUFWriter(path, "llama", split_max_tensors=split_max_tensors)
    writer.add_name("tiny-llama")
    writer.add_file_type(LlamaFileType.ALL_F32)
    writer.add_context_length(context_length)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(N_LAYER)
    writer.add_feed_forward_length(N_FF)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD_KV)
    writer.add_layer_norm_rms_eps(RMS_EPS)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    if chat_template:
        writer.add_chat_template(CHAT_TEMPLATE)
    weights = _random_weights(tiny_llama_tensor_shapes(len(tokens)), seed)
    for name, array in (_ending_at_once(weights) if ends_at_once else weights).items():
        writer.add_tensor(name, array)
    return writer


def _finish(writer: GGUFWriter) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def write_tiny_gguf(
    path: Path,
    *,
    context_length: int = 512,
    chat_template: bool = True,
    seed: int = 0,
    ends_at_once: bool = False,
) -> Path:
    """A ~0.45 MB llama GGUF (2 blocks, n_embd 64, 4/2 heads, F32) that llama-server can load. With
    `ends_at_once` every answer is end-of-text at once (`_ending_at_once`): a client that fails on an answer
    cut by its length (Claude Code) gets a complete, empty one, however it samples."""
    _finish(_tiny_llama_writer(path, context_length, chat_template, seed, ends_at_once=ends_at_once))
    return path


def write_tiny_gguf_shards(dir: Path, n: int = 2, stem: str = "tiny") -> list[Path]:
    """The tiny model as a gguf-split set `<stem>-0000i-of-0000N.gguf`, tensors divided across the shards.

    GGUFWriter writes split.no / split.count / split.tensors.count as gguf-split does (all other metadata in
    the first shard only).
    """
    n_tensors = len(tiny_llama_tensor_shapes(0))
    per_shard = math.ceil(n_tensors / n) if n >= 2 else 0
    if n < 2 or math.ceil(n_tensors / per_shard) != n:
        raise ValueError(f"cannot split the tiny model's {n_tensors} tensors into {n} shards")
    _finish(_tiny_llama_writer(dir / f"{stem}.gguf", 512, True, 0, split_max_tensors=per_shard))
    shards = [dir / f"{stem}-{i:05d}-of-{n:05d}.gguf" for i in range(1, n + 1)]
    assert all(shard.is_file() for shard in shards)
    return shards


# --- safetensors -------------------------------------------------------------------------------------------

_NUMPY_TO_SAFETENSORS = {
    np.dtype(np.float32): "F32",
    np.dtype(np.float16): "F16",
    np.dtype(np.float64): "F64",
    np.dtype(np.int64): "I64",
    np.dtype(np.int32): "I32",
    np.dtype(np.int8): "I8",
    np.dtype(np.uint8): "U8",
    np.dtype(np.bool_): "BOOL",
}


def safetensors_bytes(
    tensors: Mapping[str, np.ndarray[Any, Any]], metadata: Mapping[str, str] | None = None
) -> bytes:
    """A safetensors file: u64 header length, JSON header, then the tensors back to back."""
    header: dict[str, Any] = {}
    if metadata is not None:
        header["__metadata__"] = dict(metadata)
    offset = 0
    for name, array in tensors.items():
        end = offset + array.nbytes
        header[name] = {
            "dtype": _NUMPY_TO_SAFETENSORS[array.dtype],
            "shape": list(array.shape),
            "data_offsets": [offset, end],
        }
        offset = end
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the reference writer pads the header to 8 bytes
    data = b"".join(
        np.ascontiguousarray(a).astype(a.dtype.newbyteorder("<")).tobytes() for a in tensors.values()
    )
    return struct.pack("<Q", len(raw)) + raw + data


def write_safetensors(
    path: Path, tensors: Mapping[str, np.ndarray[Any, Any]], metadata: Mapping[str, str] | None = None
) -> Path:
    path.write_bytes(safetensors_bytes(tensors, metadata))
    return path


def _byte_level_alphabet() -> list[str]:
    """The 256 printable characters a byte-level BPE uses for bytes (printable bytes map to themselves)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    extra = 0
    chars = []
    for b in range(256):
        if b in printable:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return chars


def tiny_tokenizer_json() -> dict[str, Any]:
    """A minimal byte-level BPE tokenizer.json: <s>, </s>, then the 256 byte symbols, no merges."""
    vocab = {"<s>": 0, "</s>": 1} | {c: i + 2 for i, c in enumerate(_byte_level_alphabet())}
    special = [
        {"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False}
        | {"normalized": False, "special": True}
        for i, t in enumerate(["<s>", "</s>"])
    ]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": special,
        "normalizer": None,
        "pre_tokenizer": byte_level,
        "post_processor": None,
        "decoder": byte_level,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": [],
        },
    }


def tiny_hf_llama_shapes(n_vocab: int) -> dict[str, tuple[int, ...]]:
    """Hugging Face LlamaForCausalLM tensor names and shapes for the tiny hyper-parameters."""
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (n_vocab, N_EMBD)}
    for i in range(N_LAYER):
        p = f"model.layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (N_EMBD,),
            p + "self_attn.q_proj.weight": (N_HEAD * HEAD_DIM, N_EMBD),
            p + "self_attn.k_proj.weight": (N_HEAD_KV * HEAD_DIM, N_EMBD),
            p + "self_attn.v_proj.weight": (N_HEAD_KV * HEAD_DIM, N_EMBD),
            p + "self_attn.o_proj.weight": (N_EMBD, N_HEAD * HEAD_DIM),
            p + "post_attention_layernorm.weight": (N_EMBD,),
            p + "mlp.gate_proj.weight": (N_FF, N_EMBD),
            p + "mlp.up_proj.weight": (N_FF, N_EMBD),
            p + "mlp.down_proj.weight": (N_EMBD, N_FF),
        }
    shapes |= {"model.norm.weight": (N_EMBD,), "lm_head.weight": (n_vocab, N_EMBD)}
    return shapes


TINY_HF_VOCAB = 258  # <s>, </s> and the 256 byte symbols of tiny_tokenizer_json()


def write_tiny_safetensors_dir(dir: Path) -> Path:
    """A Hugging Face-style folder: model.safetensors (F32), config.json, tokenizer files, template, licence.

    Also a dot-file `.hidden` (packaging must skip it) and a nested `sub/extra.txt`.
    """
    dir.mkdir(parents=True, exist_ok=True)
    weights = _random_weights(tiny_hf_llama_shapes(TINY_HF_VOCAB), seed=0)
    write_safetensors(dir / "model.safetensors", weights, {"format": "pt"})
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": N_EMBD,
        "intermediate_size": N_FF,
        "num_hidden_layers": N_LAYER,
        "num_attention_heads": N_HEAD,
        "num_key_value_heads": N_HEAD_KV,
        "max_position_embeddings": 512,
        "rms_norm_eps": RMS_EPS,
        "vocab_size": TINY_HF_VOCAB,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }
    (dir / "config.json").write_text(json.dumps(config, indent=2))
    tokenizer_config = {
        "bos_token": "<s>",
        "eos_token": "</s>",
        "model_max_length": 512,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    (dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
    (dir / "tokenizer.json").write_text(json.dumps(tiny_tokenizer_json()))
    (dir / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    (dir / "LICENSE").write_text("MIT License\n\nThis tiny test model has random weights.\n")
    (dir / ".hidden").write_text("must not be packaged\n")
    (dir / "sub").mkdir(exist_ok=True)
    (dir / "sub" / "extra.txt").write_text("a nested file\n")
    return dir


# --- DDUF --------------------------------------------------------------------------------------------------


def tiny_dduf_entries() -> list[tuple[str, bytes]]:
    """Entries of a small diffusers pipeline: model_index.json, a scheduler and a VAE with tiny weights."""
    index = {
        "_class_name": "StableDiffusionPipeline",
        "_diffusers_version": "0.32.0",
        "scheduler": ["diffusers", "DDIMScheduler"],
        "vae": ["diffusers", "AutoencoderKL"],
    }
    scheduler = {"_class_name": "DDIMScheduler", "num_train_timesteps": 1000}
    vae = {"_class_name": "AutoencoderKL", "block_out_channels": [4, 8], "latent_channels": 4}
    weights = _random_weights({"encoder.conv_in.weight": (4, 3, 3, 3), "encoder.conv_in.bias": (4,)}, seed=1)
    return [
        ("model_index.json", json.dumps(index).encode()),
        ("scheduler/scheduler_config.json", json.dumps(scheduler).encode()),
        ("vae/config.json", json.dumps(vae).encode()),
        ("vae/diffusion_pytorch_model.safetensors", safetensors_bytes(weights)),
    ]


def write_tiny_dduf(path: Path) -> Path:
    """A small valid DDUF (a ZIP of STORED entries), written by huggingface_hub."""
    export_entries_as_dduf(path, tiny_dduf_entries())
    return path


def write_dduf_with_compressed_entry(path: Path) -> Path:
    """Hostile: otherwise valid, but one entry is DEFLATE-compressed."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        for name, content in tiny_dduf_entries():
            method = zipfile.ZIP_DEFLATED if name == "vae/config.json" else zipfile.ZIP_STORED
            zf.writestr(name, content, compress_type=method)
    return path


def write_dduf_with_entry_name(path: Path, name: str) -> Path:
    """Hostile: a valid DDUF plus an entry with the given raw ASCII name, e.g. "../x.json" or "a\\x00.json".

    zipfile cuts names at NUL, so the entry is written under a same-length placeholder and the name bytes are
    patched into both the local and the central header afterwards.
    """
    raw_name = name.encode("ascii")
    placeholder = b"~" * len(raw_name)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        for entry, content in tiny_dduf_entries():
            zf.writestr(entry, content)
        zf.writestr(placeholder.decode(), b"{}")
    data = path.read_bytes()
    assert data.count(placeholder) == 2, "placeholder must appear only in the two headers"
    path.write_bytes(data.replace(placeholder, raw_name))
    return path
