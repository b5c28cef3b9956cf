"""Safetensors metadata reader that survives hostile files.

Format: an 8-byte little-endian header length N, N bytes of JSON
`{name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {str: str}}`, then the tensor data.
Only the header is read (capped at 100 MB, as DMR caps it). The checks are those of the reference
`safetensors` loader, so a file accepted here is one vLLM or transformers can load: known dtypes, shapes of
non-negative integers, each tensor's byte range matching shape x dtype, and the ranges tiling the data region
exactly, with no gap, overlap or trailing bytes.

The values for the model's config are DMR's (`pkg/distribution/format/safetensors.go`), so the same files
give the same config: parameters, quantization (one dtype, "mixed" or "unknown"), architecture
(`__metadata__.architecture`) and metadata (`__metadata__` plus `tensor_count`) from the first file; the size
of all of them; the context size from config.json's first usable key, where config.json that cannot be
read or parsed only means no context size (DMR logs and goes on).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modelrunner.artifact.gguf import complete_shard_set
from modelrunner.artifact.units import format_parameters, format_size
from modelrunner.errors import InvalidModelFile

__all__ = ["SafetensorsInfo", "find_safetensors_shards", "read_safetensors"]

_MAX_JSON_BYTES = 100 * 1024 * 1024  # DMR's cap for safetensors headers and config.json
_MAX_DIMS = 64
_MAX_CONTEXT = 2**31 - 1
_CONTEXT_KEYS = (
    "max_position_embeddings",
    "n_ctx",
    "n_positions",
    "max_length",
    "max_sequence_length",
    "model_max_length",
)
# Bits per element of every dtype the safetensors format defines.
_DTYPE_BITS = {
    "BOOL": 8,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "C64": 64,
    "F64": 64,
    "I64": 64,
    "U64": 64,
}


@dataclass(frozen=True)
class SafetensorsInfo:
    architecture: str
    parameter_count: int
    parameters: str
    quantization: str
    size_bytes: int
    size: str
    context_size: int | None
    metadata: dict[str, str]


@dataclass(frozen=True, slots=True)  # one per tensor of headers up to 100 MB: keep it small
class _Tensor:
    name: str
    dtype: str
    n_elements: int
    begin: int
    end: int


@dataclass(frozen=True)
class _File:
    metadata: dict[str, str]
    tensors: list[_Tensor]
    size: int


def _load_json(raw: bytes, name: str, what: str) -> Any:
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        # ValueError covers JSONDecodeError and integers too long to convert.
        raise InvalidModelFile(f"{name}: {what} is not valid UTF-8 JSON") from None


def _read_header(path: Path) -> tuple[bytes, int]:
    name = path.name
    try:
        with path.open("rb") as f:
            size = path.stat().st_size
            if size < 8:
                raise InvalidModelFile(f"{name}: too small to be a safetensors file ({size} bytes)")
            n = int.from_bytes(f.read(8), "little")
            if n > size - 8:
                raise InvalidModelFile(f"{name}: header length {n} is larger than the file ({size} bytes)")
            if n > _MAX_JSON_BYTES:
                raise InvalidModelFile(f"{name}: header length {n} exceeds the {_MAX_JSON_BYTES}-byte limit")
            return f.read(n), size
    except OSError as e:
        raise InvalidModelFile(f"{name}: cannot read file ({e.strerror or type(e).__name__})") from None


def _short(value: Any) -> str:
    """A short rendering for messages; containers from a hostile header may be huge or deeply nested."""
    if isinstance(value, list) and all(isinstance(v, int) for v in value[:8]):
        text = repr(value[:8])[:-1] + (", ...]" if len(value) > 8 else "]")
    elif isinstance(value, (str, int, float)) or value is None:
        text = repr(value)
    else:
        text = f"<{type(value).__name__}>"
    return text if len(text) <= 60 else text[:57] + "..."


def _tensor(name: str, tensor_name: str, spec: Any, data_len: int) -> _Tensor:
    # Runs once per tensor of headers up to 100 MB, so checks are plain loops rather than generators.
    def bad(problem: str) -> InvalidModelFile:
        return InvalidModelFile(f"{name}: tensor {tensor_name[:80]!r} {problem}")

    if type(spec) is not dict:
        raise bad("is not described by a JSON object")
    dtype, shape, offsets = spec.get("dtype"), spec.get("shape"), spec.get("data_offsets")
    if type(dtype) is not str or dtype not in _DTYPE_BITS:
        raise bad(f"has unknown dtype {_short(dtype)}")
    if (
        type(offsets) is not list
        or len(offsets) != 2
        or type(offsets[0]) is not int
        or type(offsets[1]) is not int
    ):
        raise bad("has invalid data_offsets (expected [begin, end])")
    begin, end = offsets
    if not 0 <= begin <= end:
        raise bad(f"has data_offsets [{begin}, {end}] that do not form a byte range")
    if end > data_len:
        raise bad(f"has data_offsets [{begin}, {end}] outside the {data_len}-byte data region")
    if type(shape) is not list or len(shape) > _MAX_DIMS:
        raise bad("has an invalid shape (expected a list of non-negative integers)")
    # JSON gives int or bool: `type(...) is int` refuses both bools and floats. The product is checked as it
    # grows, so an absurd shape is refused before it gets huge: no tensor can have more than 2 elements per
    # byte of the data region (the smallest dtype is 4 bits), unless a zero dimension makes it empty.
    n_elements = 1
    for dim in shape:
        if type(dim) is not int or dim < 0:
            raise bad("has an invalid shape (expected a list of non-negative integers)")
        n_elements *= dim
        if n_elements > 2 * data_len and 0 not in shape:
            raise bad(f"has shape {_short(shape)}, too large for the file")
    n_bits = n_elements * _DTYPE_BITS[dtype]
    if n_bits % 8 or n_bits // 8 != end - begin:
        raise bad(
            f"has {end - begin} bytes of data, inconsistent with shape {_short(shape)} and dtype {dtype}"
        )
    return _Tensor(name=tensor_name, dtype=dtype, n_elements=n_elements, begin=begin, end=end)


def _parse_file(path: Path) -> _File:
    name = path.name
    raw, size = _read_header(path)
    data_len = size - 8 - len(raw)
    header = _load_json(raw, name, "header")
    del raw  # up to 100 MB, not needed while the tensors are checked
    if not isinstance(header, dict):
        raise InvalidModelFile(f"{name}: header is not a JSON object")
    metadata = header.pop("__metadata__", None)
    metadata = {} if metadata is None else metadata
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise InvalidModelFile(f"{name}: __metadata__ must map strings to strings")

    tensors = [_tensor(name, tensor_name, spec, data_len) for tensor_name, spec in header.items()]
    del header

    # The tensors must tile the data region exactly.
    covered = 0
    for tensor in sorted(tensors, key=lambda t: (t.begin, t.end)):
        if tensor.begin != covered:
            raise InvalidModelFile(
                f"{name}: tensor {tensor.name[:80]!r} starts at data byte {tensor.begin}, expected {covered}"
            )
        covered = tensor.end
    if covered != data_len:
        raise InvalidModelFile(f"{name}: tensors cover {covered} bytes but the data region has {data_len}")
    return _File(metadata=metadata, tensors=tensors, size=size)


def _read_config(path: Path) -> dict[str, Any]:
    """config.json as DMR reads it for the context size: anything unreadable reads as `{}`."""
    try:
        with path.open("rb") as f:
            raw = f.read(_MAX_JSON_BYTES + 1)
        config = json.loads(raw.decode("utf-8")) if len(raw) <= _MAX_JSON_BYTES else None
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return {}
    return config if isinstance(config, dict) else {}


def _context_size(config: dict[str, Any]) -> int | None:
    # DMR's order (that of llama.cpp's convert_hf_to_gguf.py). Go decodes each value into an int64: only
    # JSON integers qualify (not 4096.0, "4096" or true), and values outside 1..2^31-1 are skipped.
    for key in _CONTEXT_KEYS:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= _MAX_CONTEXT:
            return value
    return None


def read_safetensors(paths: Sequence[Path], config_json: Path | None) -> SafetensorsInfo:
    """Check every file given (all must be sound); the values are DMR's, which reads only the first
    (`parameter_count` alone counts them all). `config_json`: the config.json next to the weights."""
    if not paths:
        raise InvalidModelFile("no safetensors file given")
    files = [_parse_file(Path(p)) for p in paths]
    config = _read_config(config_json) if config_json is not None else {}
    first = files[0]
    dtypes = {t.dtype for t in first.tensors}
    quantization = dtypes.pop() if len(dtypes) == 1 else ("mixed" if dtypes else "unknown")
    size_bytes = sum(f.size for f in files)
    return SafetensorsInfo(
        architecture=first.metadata.get("architecture", ""),
        parameter_count=sum(t.n_elements for f in files for t in f.tensors),
        parameters=format_parameters(sum(t.n_elements for t in first.tensors)),
        quantization=quantization,
        size_bytes=size_bytes,
        size=format_size(size_bytes),
        context_size=_context_size(config),
        metadata=first.metadata | {"tensor_count": str(len(first.tensors))},
    )


def find_safetensors_shards(path: Path) -> list[Path]:
    """All shards of `NAME-0000i-of-0000N.safetensors` from any member (full set required); else `[path]`."""
    return complete_shard_set(path, ".safetensors")
