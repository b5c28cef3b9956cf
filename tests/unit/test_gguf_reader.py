from __future__ import annotations

import math
import struct
from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
import pytest

from modelrunner.artifact.gguf import find_gguf_shards, read_gguf
from modelrunner.errors import InvalidModelFile
from tests.models import (
    CHAT_TEMPLATE,
    spm_vocab,
    tiny_llama_tensor_shapes,
    write_tiny_gguf,
    write_tiny_gguf_shards,
)

TINY_PARAMS = sum(math.prod(s) for s in tiny_llama_tensor_shapes(len(spm_vocab()[0])).values())

# --- hand-made GGUF bytes for hostile cases ---------------------------------------------------------------

U32, I32, F32, BOOL, STR, ARR, U64 = 4, 5, 6, 7, 8, 9, 10


def s(text: bytes | str, length: int | None = None) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw) if length is None else length) + raw


def kv(key: str, vtype: int, payload: bytes) -> bytes:
    return s(key) + struct.pack("<I", vtype) + payload


def tensor_info(name: str, dims: list[int], ttype: int = 0, offset: int = 0) -> bytes:
    return (
        s(name)
        + struct.pack("<I", len(dims))
        + b"".join(struct.pack("<Q", d) for d in dims)
        + (struct.pack("<IQ", ttype, offset))
    )


def header(n_tensors: int, n_kv: int, version: int = 3, magic: bytes = b"GGUF") -> bytes:
    return magic + struct.pack("<IQQ", version, n_tensors, n_kv)


ARCH_KV = kv("general.architecture", STR, s("llama"))


def gguf_bytes(kvs: list[bytes], infos: list[bytes], data: bytes, version: int = 3) -> bytes:
    """A GGUF with the given raw KVs and tensor infos, data aligned to 32 bytes after them."""
    body = header(len(infos), len(kvs), version) + b"".join(kvs) + b"".join(infos)
    return body + b"\0" * (-len(body) % 32) + data


def minimal() -> bytes:
    """One KV, one F32 tensor of 4 elements: the valid base the hostile cases vary."""
    return gguf_bytes([ARCH_KV], [tensor_info("w", [4])], b"\0" * 16)


# --- happy path ------------------------------------------------------------------------------------------


def test_minimal_hand_made_file_is_valid(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    path.write_bytes(minimal())
    info = read_gguf([path])
    assert (info.architecture, info.parameter_count, info.tensor_data_bytes) == ("llama", 4, 16)
    # No general.file_type, and a tensor name gguf-parser's guess does not count: "Unknown", as DMR.
    assert info.quantization == "Unknown"


def test_tiny_model(tmp_path: Path) -> None:
    path = write_tiny_gguf(tmp_path / "tiny.gguf")
    info = read_gguf([path])

    assert info.architecture == "llama"
    assert info.parameter_count == TINY_PARAMS == 113_088
    assert info.parameters == "113.09K"
    assert info.quantization == "MOSTLY_F32"  # gguf-parser's name for general.file_type 0
    assert info.size_bytes == path.stat().st_size
    assert info.size == "441.75KiB"  # the tensor data, in gguf-parser's units
    assert info.context_size == 512
    assert info.chat_template == CHAT_TEMPLATE
    assert info.tensor_data_bytes == 4 * TINY_PARAMS
    assert (info.block_count, info.embedding_length, info.head_count, info.head_count_kv) == (2, 64, 4, 2)
    assert (info.key_length, info.value_length, info.sliding_window) == (None, None, None)

    md = info.metadata
    assert md["general.architecture"] == "llama"
    assert md["general.file_type"] == "0"
    assert md["llama.context_length"] == "512"
    assert md["llama.attention.layer_norm_rms_epsilon"] == "0.000010"  # Go's %f, as DMR prints floats
    assert md["tokenizer.ggml.add_bos_token"] == "true"
    assert md["tokenizer.chat_template"] == CHAT_TEMPLATE
    # The vocabulary arrays (305 elements) are over DMR's 50-element limit.
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
        assert key not in md


def test_agrees_with_gguf_reader(tmp_path: Path) -> None:
    """gguf.GGUFReader, trusted on valid files, is the oracle for values and tensor sizes."""
    path = write_tiny_gguf(tmp_path / "tiny.gguf", seed=3)
    info = read_gguf([path])
    reader = gguf.GGUFReader(path)
    assert info.parameter_count == sum(int(t.n_elements) for t in reader.tensors)
    assert info.tensor_data_bytes == sum(int(t.n_bytes) for t in reader.tensors)
    expected: dict[str, str] = {}
    for field in reader.fields.values():
        if field.name.startswith("GGUF."):  # the reader's pseudo-fields: version and counts
            continue
        value = field.contents()
        if isinstance(value, list):
            if len(value) <= 50:
                expected[field.name] = ", ".join(str(v) for v in value)
        elif isinstance(value, bool):
            expected[field.name] = str(value).lower()
        elif isinstance(value, float):
            expected[field.name] = f"{value:f}"
        else:
            expected[field.name] = str(value)
    assert info.metadata == expected


def test_options(tmp_path: Path) -> None:
    info = read_gguf([write_tiny_gguf(tmp_path / "a.gguf", context_length=1024, chat_template=False)])
    assert info.context_size == 1024
    assert info.chat_template is None
    assert "tokenizer.chat_template" not in info.metadata


def test_metadata_arrays_follow_dmr_rules(tmp_path: Path) -> None:
    path = tmp_path / "arrays.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_array("t.ints", [1, 2, 3])
    writer.add_array("t.strings", ["a", "b c"])
    writer.add_array("t.floats", [0.5, 1.25])
    writer.add_array("t.bools", [True, False])
    writer.add_array("t.fifty", list(range(50)))
    writer.add_array("t.fifty_one", list(range(51)))
    writer.add_array("t.long_strings", [f"s{i}" for i in range(51)])
    writer.add_key_value("t.nested", [[1, 2], [3]], gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.ARRAY)
    writer.add_uint64("t.u64", 2**63)
    writer.add_int32("t.neg", -7)
    writer.add_float64("t.f64", 1e-7)
    writer.add_tensor("w", np.zeros(4, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    md = read_gguf([path]).metadata
    assert md["t.ints"] == "1, 2, 3"
    assert md["t.strings"] == "a, b c"
    assert md["t.floats"] == "0.500000, 1.250000"
    assert md["t.bools"] == "true, false"
    assert md["t.fifty"] == ", ".join(str(i) for i in range(50))
    assert "t.fifty_one" not in md
    assert "t.long_strings" not in md
    assert md["t.nested"] == ""  # DMR formats nested arrays as nothing
    assert md["t.u64"] == str(2**63)
    assert md["t.neg"] == "-7"
    assert md["t.f64"] == "0.000000"


def _with_file_type(tmp_path: Path, file_type: int | None, dtype: type = np.float32) -> Path:
    path = tmp_path / "ft.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    if file_type is not None:
        writer.add_file_type(file_type)
    writer.add_tensor("output_norm.weight", np.ones(32, dtype=np.float32))
    for i in range(3):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(32, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.attn_q.weight", np.zeros((32, 32), dtype=dtype))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize(
    ("file_type", "dtype", "expected"),
    [
        # gguf-parser v0.24.0's GGUFFileType.String(), which DMR stores as the quantization
        (15, np.float32, "MOSTLY_Q4_K_M"),  # general.file_type wins
        (1, np.float32, "MOSTLY_F16"),
        (32, np.float32, "MOSTLY_BF16"),
        (7, np.float32, "MOSTLY_Q8_0"),
        (None, np.float16, "MOSTLY_F16"),  # no file type: dominant counted tensor type, F32 set aside
        (None, np.float32, "MOSTLY_F32"),
        (39, np.float16, "MOSTLY_F16"),  # 39 is gguf-parser's "Unknown": guessed too
        (999, np.float16, "GGUFFileType(999)"),  # any other value is named as Go's stringer names it
    ],
)
def test_quantization(tmp_path: Path, file_type: int | None, dtype: type, expected: str) -> None:
    assert read_gguf([_with_file_type(tmp_path, file_type, dtype)]).quantization == expected


# --- shards ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("member", [1, 2, 3])
def test_shard_set_found_from_any_member(tmp_path: Path, member: int) -> None:
    shards = write_tiny_gguf_shards(tmp_path, n=3)
    assert find_gguf_shards(shards[member - 1]) == shards


def test_shard_set_is_summed(tmp_path: Path) -> None:
    shards = write_tiny_gguf_shards(tmp_path, n=3)
    info = read_gguf(shards)
    assert info.parameter_count == TINY_PARAMS
    assert info.tensor_data_bytes == 4 * TINY_PARAMS
    assert info.size_bytes == sum(p.stat().st_size for p in shards)
    assert info.architecture == "llama"
    assert info.context_size == 512
    assert info.metadata["split.count"] == "3"
    assert info.metadata["split.tensors.count"] == "21"


def test_missing_shard_refused(tmp_path: Path) -> None:
    shards = write_tiny_gguf_shards(tmp_path, n=3)
    shards[1].unlink()
    with pytest.raises(InvalidModelFile) as err:
        find_gguf_shards(shards[0])
    assert err.value.message == "incomplete shard set: missing tiny-00002-of-00003.gguf"


def test_partial_or_disordered_shard_list_refused(tmp_path: Path) -> None:
    shards = write_tiny_gguf_shards(tmp_path, n=2)
    with pytest.raises(InvalidModelFile, match="incomplete shard set"):
        read_gguf(shards[:1])
    with pytest.raises(InvalidModelFile, match="expected shard 1"):
        read_gguf(shards[::-1])


def test_tensor_in_two_files_refused(tmp_path: Path) -> None:
    (tmp_path / "a.gguf").write_bytes(minimal())
    (tmp_path / "b.gguf").write_bytes(minimal())
    with pytest.raises(InvalidModelFile, match="more than one shard"):
        read_gguf([tmp_path / "a.gguf", tmp_path / "b.gguf"])


def test_non_sharded_and_bad_shard_names(tmp_path: Path) -> None:
    plain = tmp_path / "model-q4.gguf"
    assert find_gguf_shards(plain) == [plain]
    for name in ("x-00004-of-00003.gguf", "x-00000-of-00002.gguf"):
        with pytest.raises(InvalidModelFile, match="invalid shard name"):
            find_gguf_shards(tmp_path / name)


# --- hostile files ---------------------------------------------------------------------------------------

BIG = 2**62

HOSTILE: dict[str, Callable[[], bytes]] = {
    "empty": lambda: b"",
    "bad magic": lambda: b"GGML" + minimal()[4:],
    "version 1": lambda: gguf_bytes([ARCH_KV], [], b"", version=1),
    "version 4": lambda: gguf_bytes([ARCH_KV], [], b"", version=4),
    "big endian": lambda: minimal()[:4] + struct.pack(">I", 3) + minimal()[8:],
    "truncated header": lambda: minimal()[:20],
    "truncated in a key": lambda: header(0, 1) + s("general.architecture")[:18],
    "truncated tensor data": lambda: minimal()[:-1],
    "huge kv count": lambda: header(0, BIG) + ARCH_KV,
    "huge tensor count": lambda: header(BIG, 1) + ARCH_KV,
    "huge key length": lambda: header(0, 1) + s("general.architecture", BIG),
    "huge string value": lambda: header(0, 1) + kv("general.name", STR, s("x", BIG)),
    "huge numeric array": lambda: header(0, 1) + kv("a", ARR, struct.pack("<IQ", U32, BIG)),
    "huge string array": lambda: header(0, 1) + kv("a", ARR, struct.pack("<IQ", STR, BIG)),
    "huge string in long array": lambda: (
        header(0, 1) + kv("a", ARR, struct.pack("<IQ", STR, 60) + s("x") * 59 + s("x", BIG))
    ),
    "huge nested array": lambda: header(0, 1) + kv("a", ARR, struct.pack("<IQ", ARR, BIG)),
    "huge tensor name": lambda: header(1, 0) + s("w", BIG) + b"\0" * 32,
    "string over the cap": lambda: header(0, 1) + kv("c", STR, s(b"x" * ((16 << 20) + 1))),
    "unknown value type": lambda: header(0, 1) + kv("a", 99, b"\0" * 16),
    "unknown array element type": lambda: header(0, 1) + kv("a", ARR, struct.pack("<IQ", 99, 1) + b"\0" * 8),
    "arrays nested too deep": lambda: (
        header(0, 1) + kv("a", ARR, struct.pack("<IQ", ARR, 1) * 9 + struct.pack("<IQ", U32, 0))
    ),
    "duplicate key": lambda: gguf_bytes([ARCH_KV, ARCH_KV], [], b""),
    "alignment zero": lambda: gguf_bytes([kv("general.alignment", U32, struct.pack("<I", 0))], [], b""),
    "alignment not a power of two": lambda: gguf_bytes(
        [kv("general.alignment", U32, struct.pack("<I", 24))], [], b""
    ),
    "five dims": lambda: gguf_bytes([ARCH_KV], [tensor_info("w", [1, 1, 1, 1, 4])], b"\0" * 16),
    "unknown tensor type": lambda: gguf_bytes([ARCH_KV], [tensor_info("w", [4], ttype=99)], b"\0" * 16),
    "retired tensor type": lambda: gguf_bytes([ARCH_KV], [tensor_info("w", [32], ttype=4)], b"\0" * 32),
    "row not a multiple of the block": lambda: gguf_bytes(
        [ARCH_KV], [tensor_info("w", [31], ttype=int(gguf.GGMLQuantizationType.Q4_0))], b"\0" * 32
    ),
    "offset past the end": lambda: gguf_bytes([ARCH_KV], [tensor_info("w", [4], offset=2**40)], b"\0" * 16),
    "offset misaligned": lambda: gguf_bytes([ARCH_KV], [tensor_info("w", [4], offset=4)], b"\0" * 32),
    "size past the end": lambda: gguf_bytes([ARCH_KV], [tensor_info("w", [2**31, 2**31])], b"\0" * 16),
    "dims product overflows": lambda: gguf_bytes([ARCH_KV], [tensor_info("w", [BIG, BIG, BIG])], b"\0" * 16),
    "dim beyond int64": lambda: gguf_bytes([ARCH_KV], [tensor_info("w", [2**64 - 1])], b"\0" * 16),
    "duplicate tensor": lambda: gguf_bytes(
        [ARCH_KV], [tensor_info("w", [4]), tensor_info("w", [4], offset=32)], b"\0" * 48
    ),
    "overlapping tensors": lambda: gguf_bytes(
        [ARCH_KV], [tensor_info("a", [4]), tensor_info("b", [4], offset=0)], b"\0" * 48
    ),
}


@pytest.mark.parametrize("case", HOSTILE)
def test_hostile_file_refused(tmp_path: Path, case: str) -> None:
    path = tmp_path / "hostile.gguf"
    path.write_bytes(HOSTILE[case]())
    with pytest.raises(InvalidModelFile) as err:
        read_gguf([path])
    message = err.value.message
    assert message.startswith("hostile.gguf: ") and len(message) > len("hostile.gguf: ")
    assert str(tmp_path) not in message


def test_hostile_mutations_of_a_real_file(tmp_path: Path) -> None:
    """Truncations of the tiny model's header, and high-byte flips across it, are either read or refused
    with InvalidModelFile: never another exception."""
    valid = write_tiny_gguf(tmp_path / "tiny.gguf").read_bytes()
    header_end = gguf.GGUFReader(tmp_path / "tiny.gguf").data_offset  # KVs and tensor infos
    path = tmp_path / "m.gguf"
    for cut in range(0, header_end, 23):
        path.write_bytes(valid[:cut])
        with pytest.raises(InvalidModelFile):
            read_gguf([path])
    for pos in range(8, header_end, 40):
        mutated = bytearray(valid)
        mutated[pos + 7] ^= 0x40  # a high byte: turns counts and lengths into absurd values
        path.write_bytes(bytes(mutated))
        try:
            read_gguf([path])
        except InvalidModelFile as e:
            assert str(tmp_path) not in e.message


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(InvalidModelFile) as err:
        read_gguf([tmp_path / "missing.gguf"])
    assert err.value.message.startswith("missing.gguf: cannot read file")
    assert str(tmp_path) not in err.value.message


def test_walk_and_memory_budgets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The caps on walked elements and kept bytes (too large to reach in a unit test) are enforced."""
    import modelrunner.artifact.gguf as reader

    path = write_tiny_gguf(tmp_path / "tiny.gguf")
    monkeypatch.setattr(reader, "_MAX_WALKED_ELEMENTS", 100)  # the vocabulary has 305 tokens
    with pytest.raises(InvalidModelFile, match="more than 100 elements"):
        read_gguf([path])
    monkeypatch.undo()
    monkeypatch.setattr(reader, "_MAX_KEPT_BYTES", 4096)
    with pytest.raises(InvalidModelFile, match="exceed"):
        read_gguf([path])
