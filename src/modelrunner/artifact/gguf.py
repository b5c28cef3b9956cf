"""GGUF metadata reader that survives hostile files.

`gguf.GGUFReader` memory-maps a file and trusts every count and length in it, so a crafted header can make
it allocate without bound or fail deep inside numpy (it is also slow: ~30 s for a 260k-token vocabulary,
which this parser walks in ~0.2 s). This module parses the header itself instead: every
count and length is checked against the bytes left in the file before anything is read, single strings are
capped, and long arrays are walked without being kept. The `gguf` package still supplies the format's
tables (value types, tensor types and their block sizes, llama.cpp's file types).

Checks mirror what llama.cpp's loader refuses (gguf.cpp), so a file accepted here is one llama.cpp can map:
version 2 or 3, at most 4 dims, known tensor types, ne[0] a multiple of the block size, tensor data laid out
back to back at the file's alignment and inside the file.
"""

from __future__ import annotations

import math
import mmap
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeAlias

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from modelrunner.artifact import gojson
from modelrunner.artifact.gguf_config import TensorFacts, dmr_values
from modelrunner.errors import InvalidModelFile

__all__ = ["GGUFInfo", "complete_shard_set", "find_gguf_shards", "read_gguf"]

_MAGIC = b"GGUF"
_SUPPORTED_VERSIONS = (2, 3)
_MAX_DIMS = 4  # GGML_MAX_DIMS
_MAX_NAME_BYTES = 65535  # the spec's limit for keys; also applied to tensor names
_MAX_STRING_BYTES = 16 << 20  # one string value; real chat templates are tens of KB
_MAX_ARRAY_DEPTH = 8
# What parsing one file may keep in memory, in rough bytes of Python objects (strings at their length, other
# values and tensor infos at a flat cost), and how many string or array elements it may walk. Real headers
# use a few MB and well under a million elements; a crafted one is refused before it costs more.
_MAX_KEPT_BYTES = 64 << 20
_VALUE_COST = 64
_TENSOR_COST = 256
_MAX_WALKED_ELEMENTS = 1 << 24
_METADATA_ARRAY_LIMIT = 50  # DMR leaves arrays longer than this out of the config's metadata
_NUMERIC_ARRAY_KEEP = 4096  # numeric arrays up to this long are kept (per-layer hyper-parameters)
_INT64_MAX = 2**63 - 1
_DEFAULT_ALIGNMENT = 32

_SCALAR_FORMATS: dict[int, struct.Struct] = {
    GGUFValueType.UINT8: struct.Struct("<B"),
    GGUFValueType.INT8: struct.Struct("<b"),
    GGUFValueType.UINT16: struct.Struct("<H"),
    GGUFValueType.INT16: struct.Struct("<h"),
    GGUFValueType.UINT32: struct.Struct("<I"),
    GGUFValueType.INT32: struct.Struct("<i"),
    GGUFValueType.FLOAT32: struct.Struct("<f"),
    GGUFValueType.BOOL: struct.Struct("<B"),
    GGUFValueType.UINT64: struct.Struct("<Q"),
    GGUFValueType.INT64: struct.Struct("<q"),
    GGUFValueType.FLOAT64: struct.Struct("<d"),
}
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
# Smallest encoding of one element, used to refuse counts the rest of the file cannot hold.
_MIN_STRING_BYTES = _U64.size
_MIN_ARRAY_BYTES = _U32.size + _U64.size
_MIN_KV_BYTES = _MIN_STRING_BYTES + _U32.size + 1
_MIN_TENSOR_INFO_BYTES = _MIN_STRING_BYTES + _U32.size + _U32.size + _U64.size

_Value: TypeAlias = int | float | bool | str | list["_Value"] | None  # None: an array too long to keep


@dataclass(frozen=True)
class GGUFInfo:
    architecture: str
    parameter_count: int
    parameters: str
    quantization: str
    size_bytes: int
    size: str
    context_size: int | None
    metadata: dict[str, str]
    chat_template: str | None
    block_count: int | None
    embedding_length: int | None
    head_count: int | None
    head_count_kv: int | None
    key_length: int | None
    value_length: int | None
    sliding_window: int | None
    tensor_data_bytes: int
    # Where the bytes are, for the share of a model that stays on this machine when llama.cpp offloads layers
    # (to a GPU or RPC workers): bytes of each block `blk.N.*`, and of the output layer (`output*`).
    block_tensor_bytes: tuple[int, ...] = ()
    output_tensor_bytes: int = 0


@dataclass(frozen=True)
class _Tensor:
    name: str
    type: GGMLQuantizationType
    n_elements: int
    n_bytes: int


@dataclass(frozen=True)
class _File:
    kv: dict[str, _Value]
    tensors: list[_Tensor]
    size: int
    header_end: int  # where the tensor infos end (gguf-parser pads from here to find the data)


class _Cursor:
    """Reads little-endian values from a buffer, refusing any read past its end."""

    def __init__(self, buf: mmap.mmap, name: str) -> None:
        self.buf = buf
        self.name = name
        self.pos = 0
        self.kept_bytes = 0
        self.walked = 0

    def error(self, problem: str) -> InvalidModelFile:
        return InvalidModelFile(f"{self.name}: {problem}")

    def charge(self, n_bytes: int) -> None:
        self.kept_bytes += n_bytes
        if self.kept_bytes > _MAX_KEPT_BYTES:
            raise self.error(f"metadata and tensor list exceed the {_MAX_KEPT_BYTES >> 20} MiB limit")

    def remaining(self) -> int:
        return len(self.buf) - self.pos

    def need(self, n: int, what: str) -> None:
        if n > self.remaining():
            raise self.error(f"truncated or corrupt: {what} needs {n} bytes, only {self.remaining()} left")

    def unpack(self, fmt: struct.Struct, what: str) -> int | float:
        self.need(fmt.size, what)
        (value,) = fmt.unpack_from(self.buf, self.pos)
        self.pos += fmt.size
        return value  # type: ignore[no-any-return]

    def u32(self, what: str) -> int:
        return int(self.unpack(_U32, what))

    def u64(self, what: str) -> int:
        return int(self.unpack(_U64, what))

    def string(self, what: str, limit: int = _MAX_STRING_BYTES) -> str:
        n = self.u64(f"length of {what}")
        self.need(n, what)
        if n > limit:
            raise self.error(f"{what} is {n} bytes long, more than the {limit} allowed")
        self.charge(_VALUE_COST + n)
        raw = self.buf[self.pos : self.pos + n]
        self.pos += n
        return gojson.go_string(bytes(raw))

    def skip_string(self, what: str) -> None:
        n = self.u64(f"length of {what}")
        self.need(n, what)
        self.pos += n


def _read_value(cur: _Cursor, vtype: int, what: str, depth: int = 0) -> _Value:
    fmt = _SCALAR_FORMATS.get(vtype)
    if fmt is not None:
        cur.charge(_VALUE_COST)
        value = cur.unpack(fmt, what)
        return bool(value) if vtype == GGUFValueType.BOOL else value
    if vtype == GGUFValueType.STRING:
        return cur.string(what)
    if vtype == GGUFValueType.ARRAY:
        item_type, count = _array_header(cur, what, depth)
        if count <= (_NUMERIC_ARRAY_KEEP if item_type in _SCALAR_FORMATS else _METADATA_ARRAY_LIMIT):
            cur.charge(_VALUE_COST)
            return [_read_value(cur, item_type, _element(what), depth + 1) for _ in range(count)]
        _skip_items(cur, item_type, count, what, depth)
        return None
    raise cur.error(f"{what} has unknown value type {vtype}")


def _element(what: str) -> str:
    return what if what.startswith("element of ") else f"element of {what}"


def _array_header(cur: _Cursor, what: str, depth: int) -> tuple[int, int]:
    """Element type and count of an array, refusing counts the rest of the file cannot hold."""
    if depth >= _MAX_ARRAY_DEPTH:
        raise cur.error(f"{what} nests arrays more than {_MAX_ARRAY_DEPTH} deep")
    item_type = cur.u32(f"element type of {what}")
    count = cur.u64(f"length of {what}")
    fmt = _SCALAR_FORMATS.get(item_type)
    if fmt is not None:
        min_size = fmt.size
    elif item_type == GGUFValueType.STRING:
        min_size = _MIN_STRING_BYTES
    elif item_type == GGUFValueType.ARRAY:
        min_size = _MIN_ARRAY_BYTES
    else:
        raise cur.error(f"{what} has unknown element type {item_type}")
    if count > cur.remaining() // min_size:
        raise cur.error(f"{what} claims {count} elements, more than the rest of the file can hold")
    if fmt is None:  # strings and arrays are walked one by one; numbers are skipped in one step
        cur.walked += count
        if cur.walked > _MAX_WALKED_ELEMENTS:
            raise cur.error(f"arrays hold more than {_MAX_WALKED_ELEMENTS} elements in all")
    return item_type, count


def _skip_items(cur: _Cursor, item_type: int, count: int, what: str, depth: int) -> None:
    """Walks a long array (e.g. a tokenizer vocabulary) for bounds without keeping it."""
    fmt = _SCALAR_FORMATS.get(item_type)
    if fmt is not None:
        cur.pos += count * fmt.size  # fits: checked by _array_header
    elif item_type == GGUFValueType.STRING:
        # The hot loop for vocabularies of 100k+ tokens, so it works on locals.
        buf, pos, end = cur.buf, cur.pos, len(cur.buf)
        for _ in range(count):
            if pos + _U64.size <= end:
                (n,) = _U64.unpack_from(buf, pos)
                if pos + _U64.size + n <= end:
                    pos += _U64.size + n
                    continue
            cur.pos = pos
            cur.skip_string(_element(what))  # raises with the precise complaint
        cur.pos = pos
    else:
        for _ in range(count):
            inner_type, inner_count = _array_header(cur, _element(what), depth + 1)
            _skip_items(cur, inner_type, inner_count, what, depth + 1)


def _parse_file(path: Path) -> _File:
    name = path.name
    try:
        with path.open("rb") as f:
            size = path.stat().st_size
            if size < len(_MAGIC) + _U32.size:
                raise InvalidModelFile(f"{name}: too small to be a GGUF file ({size} bytes)")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                return _parse_buffer(_Cursor(buf, name), size)
    except OSError as e:
        raise InvalidModelFile(f"{name}: cannot read file ({e.strerror or type(e).__name__})") from None


def _parse_buffer(cur: _Cursor, size: int) -> _File:
    if cur.buf[: len(_MAGIC)] != _MAGIC:
        raise cur.error("not a GGUF file (bad magic)")
    cur.pos = len(_MAGIC)
    version = cur.u32("version")
    if version not in _SUPPORTED_VERSIONS:
        if int.from_bytes(version.to_bytes(4, "little"), "big") in _SUPPORTED_VERSIONS:
            raise cur.error("big-endian GGUF files are not supported")
        raise cur.error(f"unsupported GGUF version {version} (supported: 2, 3)")
    n_tensors = cur.u64("tensor count")
    n_kv = cur.u64("key-value count")
    if n_kv * _MIN_KV_BYTES + n_tensors * _MIN_TENSOR_INFO_BYTES > cur.remaining():
        raise cur.error(
            f"header claims {n_kv} key-value pairs and {n_tensors} tensors, more than the file can hold"
        )

    kv: dict[str, _Value] = {}
    for i in range(n_kv):
        key = cur.string(f"key #{i}", limit=_MAX_NAME_BYTES)
        what = f"key {key[:80]!r}"
        if key in kv:
            raise cur.error(f"duplicate {what}")
        kv[key] = _read_value(cur, cur.u32(f"type of {what}"), what)

    alignment = kv.get("general.alignment", _DEFAULT_ALIGNMENT)
    if (
        isinstance(alignment, bool)
        or not isinstance(alignment, int)
        or alignment <= 0
        or alignment & (alignment - 1)
    ):
        raise cur.error(f"general.alignment must be a power of two, got {alignment!r}")

    infos: list[tuple[str, list[int], int, int]] = []
    names: set[str] = set()
    for i in range(n_tensors):
        cur.charge(_TENSOR_COST)
        tname = cur.string(f"name of tensor #{i}", limit=_MAX_NAME_BYTES)
        what = f"tensor {tname[:80]!r}"
        if tname in names:
            raise cur.error(f"duplicate {what}")
        names.add(tname)
        n_dims = cur.u32(f"dimension count of {what}")
        if n_dims > _MAX_DIMS:
            raise cur.error(f"{what} has {n_dims} dimensions, at most {_MAX_DIMS} allowed")
        dims = [cur.u64(f"dimensions of {what}") for _ in range(n_dims)]
        ttype = cur.u32(f"type of {what}")
        offset = cur.u64(f"offset of {what}")
        infos.append((tname, dims, ttype, offset))

    header_end = cur.pos
    data_start = -(-cur.pos // alignment) * alignment
    tensors: list[_Tensor] = []
    expected_offset = 0
    for tname, dims, ttype, offset in infos:
        tensor = _tensor(cur, tname, dims, ttype)
        # llama.cpp requires tensor data back to back, each padded to the alignment.
        if offset != expected_offset:
            raise cur.error(f"tensor {tname[:80]!r} has offset {offset}, expected {expected_offset}")
        if data_start + offset + tensor.n_bytes > size:
            raise cur.error(f"data of tensor {tname[:80]!r} extends past the end of the file")
        expected_offset += -(-tensor.n_bytes // alignment) * alignment
        tensors.append(tensor)
    return _File(kv=kv, tensors=tensors, size=size, header_end=header_end)


def _tensor(cur: _Cursor, name: str, dims: list[int], ttype: int) -> _Tensor:
    what = f"tensor {name[:80]!r}"
    try:
        qtype = GGMLQuantizationType(ttype)
        block_size, type_size = GGML_QUANT_SIZES[qtype]
    except (ValueError, KeyError):
        raise cur.error(f"{what} has unknown type {ttype}") from None
    n_elements = 1
    for dim in dims:
        n_elements *= dim
        if n_elements > _INT64_MAX or dim > _INT64_MAX:
            raise cur.error(f"{what} has absurd dimensions {dims}")
    ne0 = dims[0] if dims else 1
    if ne0 % block_size:
        raise cur.error(
            f"{what} of type {qtype.name} has a first dimension ({ne0}) "
            f"that is not a multiple of its block size ({block_size})"
        )
    return _Tensor(name=name, type=qtype, n_elements=n_elements, n_bytes=n_elements // block_size * type_size)


def _format_scalar(value: int | float | str) -> str:
    # Go's fmt verbs, as DMR formats metadata: %t for bools, %f for floats, %d for integers.
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "+Inf" if value > 0 else "-Inf"
        return f"{value:f}"
    return str(value)


def _metadata_strings(kv: dict[str, _Value]) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in kv.items():
        if value is None or (isinstance(value, list) and len(value) > _METADATA_ARRAY_LIMIT):
            continue
        if isinstance(value, list):
            # Nested arrays contribute nothing, as in DMR.
            out[key] = ", ".join(
                _format_scalar(v) for v in value if v is not None and not isinstance(v, list)
            )
        else:
            out[key] = _format_scalar(value)
    return out


def _count(kv: dict[str, _Value], key: str) -> int | None:
    """A non-negative integer hyper-parameter; per-layer arrays give their maximum (worst case)."""
    value = kv.get(key)
    if isinstance(value, list):
        ints = [v for v in value if isinstance(v, int) and not isinstance(v, bool)]
        value = max(ints) if ints and len(ints) == len(value) else None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def read_gguf(paths: Sequence[Path]) -> GGUFInfo:
    """Metadata of one GGUF file or of all shards of a set, in order. The config values (architecture,
    parameters, quantization, size, context size, metadata strings) are DMR's (gguf_config.py)."""
    if not paths:
        raise InvalidModelFile("no GGUF file given")
    files = [_parse_file(Path(p)) for p in paths]
    first_name = Path(paths[0]).name
    kv = files[0].kv

    split_count = kv.get("split.count")
    if isinstance(split_count, int) and split_count > 1 and split_count != len(files):
        raise InvalidModelFile(
            f"{first_name}: incomplete shard set: the set has {split_count} shards, {len(files)} given"
        )
    for index, (path, parsed) in enumerate(zip(paths, files, strict=True)):
        split_no = parsed.kv.get("split.no")
        if len(files) > 1 and isinstance(split_no, int) and split_no != index:
            raise InvalidModelFile(f"{Path(path).name}: is shard {split_no + 1}, expected shard {index + 1}")

    tensors = [t for parsed in files for t in parsed.tensors]
    if len(files) > 1 and len({t.name for t in tensors}) != len(tensors):
        raise InvalidModelFile(f"{first_name}: the same tensor appears in more than one shard")
    # gguf-parser reads every shard's metadata but split.no into one list: DMR's config takes its
    # values from there (the metadata map: the last of a repeated key; single values: the first).
    metadata: dict[str, _Value] = {}
    first_seen: dict[str, _Value] = {}
    for parsed in files:
        for key, value in parsed.kv.items():
            if key != "split.no":
                metadata[key] = value
                first_seen.setdefault(key, value)
    dmr = dmr_values(
        first_seen,
        [TensorFacts(t.name, int(t.type), t.n_elements) for t in tensors],
        _model_size(files),
    )
    architecture = dmr.architecture
    template = first_seen.get("tokenizer.chat_template")
    return GGUFInfo(
        architecture=architecture,
        parameter_count=sum(t.n_elements for t in tensors),
        parameters=dmr.parameters,
        quantization=dmr.quantization,
        size_bytes=sum(parsed.size for parsed in files),
        size=dmr.size,
        context_size=dmr.context_size,
        metadata=_metadata_strings(metadata),
        chat_template=template if isinstance(template, str) else None,
        block_count=_count(kv, f"{architecture}.block_count"),
        embedding_length=_count(kv, f"{architecture}.embedding_length"),
        head_count=_count(kv, f"{architecture}.attention.head_count"),
        head_count_kv=_count(kv, f"{architecture}.attention.head_count_kv"),
        key_length=_count(kv, f"{architecture}.attention.key_length"),
        value_length=_count(kv, f"{architecture}.attention.value_length"),
        sliding_window=_count(kv, f"{architecture}.attention.sliding_window"),
        tensor_data_bytes=sum(t.n_bytes for t in tensors),
        block_tensor_bytes=_block_bytes(tensors),
        output_tensor_bytes=sum(t.n_bytes for t in tensors if t.name.split(".", 1)[0] in _OUTPUT_TENSORS),
    )


def _model_size(files: Sequence[_File]) -> int:
    """gguf-parser's ModelSize: per file, its size less the header padded to the alignment (a whole
    alignment's worth when the header ends aligned), in Go's uint64 arithmetic. The alignment is the first
    general.alignment seen so far in the shards (32 without one)."""
    total = 0
    declared: int | None = None
    for parsed in files:
        value = parsed.kv.get("general.alignment")
        if declared is None and isinstance(value, int) and not isinstance(value, bool):
            declared = value
        alignment = declared or _DEFAULT_ALIGNMENT
        data_start = parsed.header_end + alignment - parsed.header_end % alignment
        total += (parsed.size - data_start) % 2**64
    return total


_OUTPUT_TENSORS = ("output", "output_norm")
_BLOCK_TENSOR = re.compile(r"blk\.(\d{1,5})\.")


def _block_bytes(tensors: Sequence[_Tensor]) -> tuple[int, ...]:
    sizes: dict[int, int] = {}
    for tensor in tensors:
        match = _BLOCK_TENSOR.match(tensor.name)
        if match:
            block = int(match.group(1))
            sizes[block] = sizes.get(block, 0) + tensor.n_bytes
    return tuple(sizes.get(i, 0) for i in range(max(sizes) + 1)) if sizes else ()


def complete_shard_set(path: Path, extension: str) -> list[Path]:
    """All shards of `NAME-0000i-of-0000N<extension>` (any member given), in order; `[path]` if not sharded.

    Refuses a set with a missing member: packaging half a model would only fail later, at load time.
    """
    match = re.fullmatch(rf"(.+)-(\d{{5}})-of-(\d{{5}}){re.escape(extension)}", path.name)
    if match is None:
        return [path]
    prefix, index, total = match.group(1), int(match.group(2)), int(match.group(3))
    if not 1 <= index <= total:
        raise InvalidModelFile(f"invalid shard name: {path.name}")
    shards = [path.with_name(f"{prefix}-{i:05d}-of-{total:05d}{extension}") for i in range(1, total + 1)]
    missing = [shard.name for shard in shards if not shard.is_file()]
    if missing:
        listed = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise InvalidModelFile(f"incomplete shard set: missing {listed}")
    return shards


def find_gguf_shards(path: Path) -> list[Path]:
    """All shards of a gguf-split set (`x-00001-of-00003.gguf`) from any member; `[path]` if not sharded."""
    return complete_shard_set(path, ".gguf")
