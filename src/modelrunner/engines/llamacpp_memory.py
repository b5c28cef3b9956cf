"""How much memory one llama-server process needs for a model: weights + KV cache + compute buffers.

Follows llama.cpp's own sizing (llama-kv-cache*.cpp): the KV cache holds K and V for every layer and every
cell, cells = the context size (shared by the parallel slots, llama-server's default `-np 4` uses a unified
cache); sliding-window layers (Gemma 2/3, Cohere 2, gpt-oss, ...) keep only `window x slots + ubatch` cells,
padded to 256. The estimate is checked against the resident set of a real llama-server in the tests.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from modelrunner.artifact.gguf import GGUFInfo

MiB = 1024 * 1024
KV_PAD = 256  # llama.cpp pads cache sizes to 256 cells
DEFAULT_PARALLEL = 4  # llama-server's `-np` auto value, with a unified KV cache
DEFAULT_UBATCH = 512
# Measured with llama-server b11434 on CPU (Gemma 3 270M, -np 4): the process itself (code, threads, heap,
# vocabulary tables, the output buffer) takes ~50 MB beyond the buffers llama.cpp reports; the compute buffer
# (flash attention on) is ~21 MiB at n_ubatch 512 and n_embd 640, i.e. ~64 bytes per (ubatch token x n_embd).
BASE_OVERHEAD = 64 * MiB
COMPUTE_BYTES_PER_UBATCH_TOKEN_PER_EMBD = 64

# Bytes per element of the KV cache types (`--cache-type-k/-v`); quantised types per 32-element block.
_CACHE_TYPE_BYTES = {
    "f32": 4.0,
    "f16": 2.0,
    "bf16": 2.0,
    "q8_0": 34 / 32,
    "q4_0": 18 / 32,
    "q4_1": 20 / 32,
    "iq4_nl": 18 / 32,
    "q5_0": 22 / 32,
    "q5_1": 24 / 32,
}

# Architectures whose loader sets a sliding-window layer pattern when the GGUF has none: (n_pattern,
# dense_first). With dense_first=False every n-th layer (the last of each group) is full attention.
_SWA_PATTERNS: dict[str, tuple[int, bool]] = {
    "gemma2": (2, False),
    "gemma3": (6, False),
    "gemma-embedding": (6, False),
    "gemma3n": (5, False),
    "cohere2": (4, False),
    "llama4": (4, False),
    "gpt-oss": (2, False),
    "exaone4": (4, False),
    "olmo2": (4, False),
}


@dataclass(frozen=True)
class KvSettings:
    """What the command line decides about the cache."""

    n_ctx: int
    n_parallel: int = DEFAULT_PARALLEL
    unified: bool = True
    swa_full: bool = False
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    n_ubatch: int = DEFAULT_UBATCH


@dataclass(frozen=True)
class MemoryEstimate:
    weights: int
    kv_cache: int
    compute: int

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.compute


def _pad(n: int) -> int:
    return math.ceil(n / KV_PAD) * KV_PAD


def sliding_window_layers(info: GGUFInfo) -> list[bool]:
    """For each layer, whether it is a sliding-window layer (all False when the model has no window)."""
    n_layer = info.block_count or 0
    if not info.sliding_window:
        return [False] * n_layer
    raw = info.metadata.get(f"{info.architecture}.attention.sliding_window_pattern")
    if raw is not None:
        values = [v.strip() for v in raw.split(",")]
        if len(values) == n_layer and all(v in ("true", "false") for v in values):
            return [v == "true" for v in values]
        if len(values) == 1 and values[0].isdigit():
            return _pattern(n_layer, int(values[0]), False)
    pattern = _SWA_PATTERNS.get(info.architecture)
    if pattern is None:
        return [False] * n_layer  # unknown: count every layer at full context, which over-counts
    return _pattern(n_layer, *pattern)


def _pattern(n_layer: int, n_pattern: int, dense_first: bool) -> list[bool]:
    if n_pattern == 0:
        return [True] * n_layer
    if dense_first:
        return [il % n_pattern != 0 for il in range(n_layer)]
    return [il % n_pattern < n_pattern - 1 for il in range(n_layer)]


def kv_cache_bytes(info: GGUFInfo, kv: KvSettings, layers: Collection[int] | None = None) -> int:
    """K and V of every layer (or only of `layers`)."""
    n_layer = info.block_count or 0
    n_head = info.head_count or 1
    n_head_kv = info.head_count_kv or n_head
    head_dim = (info.embedding_length or 0) // n_head
    k_per_cell = n_head_kv * (info.key_length or head_dim) * _cache_type_bytes(kv.cache_type_k)
    v_per_cell = n_head_kv * (info.value_length or head_dim) * _cache_type_bytes(kv.cache_type_v)
    full_cells = _pad(kv.n_ctx)
    window = info.sliding_window or 0
    if kv.swa_full or window == 0:
        swa_cells = full_cells
    elif kv.unified:
        swa_cells = min(full_cells, _pad(window * kv.n_parallel + kv.n_ubatch))
    else:  # one stream per slot, each `n_ctx / slots` cells
        per_slot = max(1, kv.n_ctx // kv.n_parallel)
        swa_cells = kv.n_parallel * min(_pad(per_slot), _pad(window + kv.n_ubatch))
    total = 0.0
    for il, is_swa in enumerate(sliding_window_layers(info) or [False] * n_layer):
        if layers is None or il in layers:
            total += (swa_cells if is_swa else full_cells) * (k_per_cell + v_per_cell)
    return int(total)


def _cache_type_bytes(name: str) -> float:
    return _CACHE_TYPE_BYTES.get(name.lower(), 2.0)


def estimate(info: GGUFInfo, kv: KvSettings) -> MemoryEstimate:
    n_embd = info.embedding_length or 0
    compute = BASE_OVERHEAD + kv.n_ubatch * n_embd * COMPUTE_BYTES_PER_UBATCH_TOKEN_PER_EMBD
    # Weights: the whole file, mapped and touched at warm-up; the header (mostly the vocabulary) is read too.
    return MemoryEstimate(weights=info.size_bytes, kv_cache=kv_cache_bytes(info, kv), compute=compute)


def local_share(info: GGUFInfo, kv: KvSettings, n_gpu_layers: int | None) -> MemoryEstimate:
    """What stays in this process when llama.cpp offloads `n_gpu_layers` to other devices (RPC workers).

    As llama.cpp assigns them (llama-model.cpp): the last `n_gpu_layers` of the n_layer blocks plus the
    output layer (counted as one more) go to the devices, the first ones stay; the token embeddings always
    stay. KV cells live with their layer. None = all offloaded (`-ngl 999`, `auto`).
    """
    n_layer = len(info.block_tensor_bytes)  # the blocks whose tensors were found
    offloaded = n_layer + 1 if n_gpu_layers is None or n_gpu_layers < 0 else n_gpu_layers
    first_offloaded = max(n_layer + 1 - offloaded, 0)
    local_blocks = range(min(first_offloaded, n_layer))
    blocks = info.block_tensor_bytes
    other = info.tensor_data_bytes - sum(blocks) - info.output_tensor_bytes  # token embeddings and such
    weights = (info.size_bytes - info.tensor_data_bytes) + other + sum(blocks[i] for i in local_blocks)
    if first_offloaded > n_layer:
        weights += info.output_tensor_bytes
    kv_bytes = kv_cache_bytes(info, kv, set(local_blocks))
    return MemoryEstimate(weights=weights, kv_cache=kv_bytes, compute=estimate(info, kv).compute)


def gpu_layers(flags: Sequence[str]) -> int | None:
    """`-ngl` of the final command line: a number, or None for all (`auto`, `all`, or not given)."""
    raw = _last_value(flags, ("-ngl", "--gpu-layers", "--n-gpu-layers"))
    if raw is None or not raw.lstrip("-").isdigit():
        return None
    return int(raw)


def _last_value(flags: Sequence[str], names: tuple[str, ...]) -> str | None:
    """The value of the last occurrence of a flag (`--x v` or `--x=v`), as llama.cpp's parser keeps it."""
    value = None
    for i, token in enumerate(flags):
        name, sep, inline = token.partition("=")
        if name in names:
            if sep:
                value = inline
            elif i + 1 < len(flags):
                value = flags[i + 1]
    return value


def _has_flag(flags: Sequence[str], names: tuple[str, ...]) -> bool:
    return any(token.partition("=")[0] in names for token in flags)


def kv_settings(flags: Sequence[str], n_ctx: int) -> KvSettings:
    """KvSettings from the final command line's flags (runtime flags or LLAMA_ARGS) and the context size."""

    def number(names: tuple[str, ...], default: int) -> int:
        raw = _last_value(flags, names)
        try:
            return int(raw) if raw is not None else default
        except ValueError:
            return default

    ctx = number(("-c", "--ctx-size"), n_ctx)
    parallel = number(("-np", "--parallel"), -1)
    explicit_parallel = parallel > 0
    return KvSettings(
        n_ctx=ctx if ctx > 0 else n_ctx,
        n_parallel=parallel if explicit_parallel else DEFAULT_PARALLEL,
        # llama-server unifies the cache when it picks the slot count itself, or when told to
        unified=not explicit_parallel or _has_flag(flags, ("-kvu", "--kv-unified")),
        swa_full=_has_flag(flags, ("--swa-full",)),
        cache_type_k=_last_value(flags, ("-ctk", "--cache-type-k")) or "f16",
        cache_type_v=_last_value(flags, ("-ctv", "--cache-type-v")) or "f16",
        n_ubatch=max(1, number(("-ub", "--ubatch-size"), DEFAULT_UBATCH)),
    )
