"""The values DMR puts in a GGUF model's config, computed as it computes them.

DMR (`pkg/distribution/format/gguf.go`) takes them from gpustack/gguf-parser-go v0.24.0 (its go.mod):
`Metadata().Parameters`, `.Architecture`, `.FileType.String()` and `.Size` (the model size: the tensor data
of every shard, from the aligned end of its header to the end of the file), and
`Architecture().MaximumContextLength`; units are gguf-parser's (`864 B`, `256.35 MiB`, `183`, `16.78 M`)
with the space removed (`normalizeUnitString`). The same file therefore gets the same config here.
On upstream's assets/dummy.gguf: parameters `183`, architecture `llama`, quantization `Unknown`, size `864B`.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["DMRValues", "TensorFacts", "dmr_values"]

_INT32_MAX = 2**31 - 1
_UINT32 = 2**32
_UINT64 = 2**64

# gguf-parser's GGUFFileType names (stringer, -linecomment), by value; the value 39 is "Unknown".
_FILE_TYPES = [
    "MOSTLY_F32",
    "MOSTLY_F16",
    "MOSTLY_Q4_0",
    "MOSTLY_Q4_1",
    "MOSTLY_Q4_1_SOME_F16",
    "MOSTLY_Q4_2",
    "MOSTLY_Q4_3",
    "MOSTLY_Q8_0",
    "MOSTLY_Q5_0",
    "MOSTLY_Q5_1",
    "MOSTLY_Q2_K",
    "MOSTLY_Q3_K_S",
    "MOSTLY_Q3_K_M",
    "MOSTLY_Q3_K_L",
    "MOSTLY_Q4_K_S",
    "MOSTLY_Q4_K_M",
    "MOSTLY_Q5_K_S",
    "MOSTLY_Q5_K_M",
    "MOSTLY_Q6_K",
    "MOSTLY_IQ2_XXS",
    "MOSTLY_IQ2_XS",
    "MOSTLY_Q2_K_S",
    "MOSTLY_IQ3_XS",
    "MOSTLY_IQ3_XXS",
    "MOSTLY_IQ1_S",
    "MOSTLY_IQ4_NL",
    "MOSTLY_IQ3_S",
    "MOSTLY_IQ3_M",
    "MOSTLY_IQ2_S",
    "MOSTLY_IQ2_M",
    "MOSTLY_IQ4_XS",
    "MOSTLY_IQ1_M",
    "MOSTLY_BF16",
    "MOSTLY_Q4_0_4_4",
    "MOSTLY_Q4_0_4_8",
    "MOSTLY_Q4_0_8_8",
    "MOSTLY_TQ1_0",
    "MOSTLY_TQ2_0",
    "MOSTLY_MXFP4",
]
_UNKNOWN = len(_FILE_TYPES)  # 39

# ggml tensor type numbers (gguf-parser's GGMLType).
F32, F16, Q4_0, Q4_1, Q4_2, Q4_3, Q5_0, Q5_1, Q8_0 = 0, 1, 2, 3, 4, 5, 6, 7, 8
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K = 10, 11, 12, 13, 14
IQ2_XXS, IQ2_XS, IQ3_XXS, IQ1_S, IQ4_NL, IQ3_S, IQ2_S, IQ4_XS = 16, 17, 18, 19, 20, 21, 22, 23
IQ1_M, BF16, Q4_0_4_4, Q4_0_4_8, Q4_0_8_8, TQ1_0, TQ2_0, MXFP4 = 29, 30, 31, 32, 33, 34, 35, 39

# The dominant tensor type -> the file type it implies, where no further counting is involved
# (GetFileType in file_metadata.go).
_PLAIN = {
    F16: "MOSTLY_F16",
    Q4_0: "MOSTLY_Q4_0",
    Q4_1: "MOSTLY_Q4_1",
    Q4_2: "MOSTLY_Q4_2",
    Q4_3: "MOSTLY_Q4_3",
    Q5_0: "MOSTLY_Q5_0",
    Q5_1: "MOSTLY_Q5_1",
    Q8_0: "MOSTLY_Q8_0",
    Q6_K: "MOSTLY_Q6_K",
    IQ2_XXS: "MOSTLY_IQ2_XXS",
    IQ2_S: "MOSTLY_IQ2_M",
    IQ3_XXS: "MOSTLY_IQ3_XXS",
    IQ1_S: "MOSTLY_IQ1_S",
    IQ4_NL: "MOSTLY_IQ4_NL",
    IQ4_XS: "MOSTLY_IQ4_XS",
    IQ1_M: "MOSTLY_IQ1_M",
    BF16: "MOSTLY_BF16",
    Q4_0_4_4: "MOSTLY_Q4_0_4_4",
    Q4_0_4_8: "MOSTLY_Q4_0_4_8",
    Q4_0_8_8: "MOSTLY_Q4_0_8_8",
    TQ1_0: "MOSTLY_TQ1_0",
    TQ2_0: "MOSTLY_TQ2_0",
    MXFP4: "MOSTLY_MXFP4",
}

_DIFFUSION_ARCHITECTURES = frozenset({"flux", "sd", "sd2.5", "sd3", "stable-diffusion"})
_DIFFUSION_TENSORS = re.compile(
    r"model\.diffusion_model\.|double_blocks\.|joint_blocks\.|decoder\.|encoder\.|text_model\."
)

_BYTE_UNITS = (
    (2.0**50, "Pi"),
    (1e15, "P"),
    (2.0**40, "Ti"),
    (1e12, "T"),
    (2.0**30, "Gi"),
    (1e9, "G"),
    (2.0**20, "Mi"),
    (1e6, "M"),
    (1024.0, "Ki"),
    (1e3, "K"),
)
_NUMBER_UNITS = ((1e15, "Q"), (1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K"))
_SPACE_BEFORE_UNIT = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s+([A-Za-z]+)")


@dataclass(frozen=True)
class TensorFacts:
    name: str
    type: int  # ggml type number
    n_elements: int


@dataclass(frozen=True)
class DMRValues:
    parameters: str
    architecture: str
    quantization: str
    size: str
    context_size: int | None


def _string(kv: Mapping[str, object], key: str) -> str | None:
    value = kv.get(key)
    return value if isinstance(value, str) else None


def _numeric(kv: Mapping[str, object], key: str) -> int | None:
    """ValueNumeric's cast of a scalar number to an integer (floats truncated); None for other types."""
    value = kv.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        return int(value)
    except (OverflowError, ValueError):  # inf, nan
        return None


def _scalar(value: int, units: tuple[tuple[float, str], ...]) -> str:
    """gguf-parser's GGUF*Scalar.String(): two decimals, `.00` dropped, a space, the unit."""
    base, unit = 1.0, ""
    for candidate, name in units:
        if float(value) >= candidate:
            base, unit = candidate, name
            break
    return f"{float(value) / base:.2f}".removesuffix(".00") + " " + unit


def _normalise_units(text: str) -> str:
    """DMR's normalizeUnitString: `16.78 M` -> `16.78M`, `183 ` -> `183`."""
    return _SPACE_BEFORE_UNIT.sub(r"\1\2", text.strip())


def parameters_text(count: int) -> str:
    return _normalise_units("0" if count == 0 else _scalar(count, _NUMBER_UNITS))


def bytes_text(count: int) -> str:
    return _normalise_units("0 B" if count == 0 else _scalar(count, _BYTE_UNITS) + "B")


def _has_diffusion_tensors(tensors: Sequence[TensorFacts]) -> bool:
    return any(_DIFFUSION_TENSORS.match(t.name) for t in tensors)


def _architecture(kv: Mapping[str, object], tensors: Sequence[TensorFacts]) -> tuple[str, str]:
    """(architecture, type) as GGUFFile.Metadata() decides them."""
    hint = _string(kv, "controlvector.model_hint")
    general_type = _string(kv, "general.type")
    kind = general_type if general_type is not None else ("adapter" if hint is not None else "model")
    declared = _string(kv, "general.architecture")
    if hint is not None:
        return hint, kind
    if declared is not None and declared not in _DIFFUSION_ARCHITECTURES:
        return declared, kind
    if kind == "imatrix":
        return "imatrix", kind
    return ("diffusion" if _has_diffusion_tensors(tensors) else "llama"), kind


def _guess_file_type(architecture: str, tensors: Sequence[TensorFacts]) -> str:
    """extractFileType's guess from the tensor types when general.file_type says nothing usable."""
    counts: Counter[int] = Counter()
    for tensor in tensors:
        name = tensor.name
        if architecture == "diffusion":
            counted = name.endswith(".weight")
        else:
            counted = name.startswith(("token_embd", "blk.")) or "_norm" in name or name.endswith(".weight")
        if counted:
            counts[tensor.type] += 1
    if not counts:
        return "Unknown"
    # Go sorts the map's keys by count with an unstable sort (ties: any order); ties go to the lower type.
    ranked = sorted(counts, key=lambda t: (-counts[t], t))
    top = ranked[0]
    if top == F32:
        if len(ranked) == 1:
            return "MOSTLY_F32"
        top = ranked[1]
    if top in _PLAIN:
        return _PLAIN[top]
    if top == Q2_K:
        return "MOSTLY_Q2_K_S" if ranked[-1] == Q5_K else "MOSTLY_Q2_K"
    if top == Q3_K:
        if counts[Q8_0] > 0 or (counts[Q5_K] > 1 and counts[Q4_K] == 0):
            return "MOSTLY_Q3_K_L"
        return "MOSTLY_Q3_K_M" if counts[Q4_K] > 1 else "MOSTLY_Q3_K_S"
    if top == Q4_K:
        if counts[Q6_K] > 1:
            return "MOSTLY_Q4_K_M"
        return "MOSTLY_Q3_K_M" if counts[Q3_K] > 1 else "MOSTLY_Q4_K_S"
    if top == Q5_K:
        return "MOSTLY_Q5_K_M" if counts[Q6_K] > 1 else "MOSTLY_Q5_K_S"
    if top == IQ2_XS:
        return "MOSTLY_IQ2_S" if counts[IQ4_XS] > 1 else "MOSTLY_IQ2_XS"
    if top == IQ3_S:
        return "MOSTLY_IQ3_XS" if counts[IQ3_XXS] > 1 else "MOSTLY_IQ3_S"
    return "Unknown"


def _quantization(kv: Mapping[str, object], architecture: str, tensors: Sequence[TensorFacts]) -> str:
    """GGUFFileType.String() of general.file_type (cast to uint32), or of the guess when it is absent or
    says "Unknown" (39)."""
    declared = _numeric(kv, "general.file_type")
    file_type = _UNKNOWN if declared is None else declared % _UINT32
    if file_type == _UNKNOWN:
        return _guess_file_type(architecture, tensors)
    if file_type < _UNKNOWN:
        return _FILE_TYPES[file_type]
    return f"GGUFFileType({file_type})"


def _context_length(kv: Mapping[str, object], tensors: Sequence[TensorFacts]) -> int | None:
    """Architecture().MaximumContextLength: `<arch>.context_length` of a transformer model only."""
    if _has_diffusion_tensors(tensors):
        return None
    kind = _string(kv, "general.type") or "model"
    arch = _string(kv, "general.architecture") or "llama"
    if arch in ("clip", "controlvector") or kind in ("adapter", "imatrix"):
        return None
    value = _numeric(kv, f"{arch}.context_length")
    if value is None:
        return None
    value %= _UINT64
    return value if 0 < value <= _INT32_MAX else None


def dmr_values(kv: Mapping[str, object], tensors: Sequence[TensorFacts], model_size: int) -> DMRValues:
    """`kv`: the metadata of every shard but split.no, first occurrence first; `model_size`: gguf-parser's
    ModelSize (uint64 arithmetic, as Go does it)."""
    architecture, _ = _architecture(kv, tensors)
    return DMRValues(
        parameters=parameters_text(sum(t.n_elements for t in tensors)),
        architecture=architecture.strip(),
        quantization=_quantization(kv, architecture, tensors).strip(),
        size=bytes_text(model_size % _UINT64),
        context_size=_context_length(kv, tensors),
    )
