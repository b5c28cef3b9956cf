"""Proving a `llama-server` build on this CPU before it is cached or installed.

A build that compiles can still die on its first quantized matrix product: ggml's Intel AMX kernels, compiled
in by `-march=native` on Sapphire Rapids and later, end in SIGILL on some machines (upstream PR #26954),
while F32 models never reach those kernels. So each new build answers a few tokens on a small model of each
common weight type (Q4_0, Q4_1, Q8_0, Q4_K, F16), with shapes that every CPU kernel family accepts (AMX's
included: rows and columns multiples of 256), written here with `gguf` and random weights. A model that
dies by a signal is reported with it, so that build.py can rebuild without the instructions to blame.
"""

from __future__ import annotations

import contextlib
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter, LlamaFileType, TokenType
from gguf.quants import quantize

from modelrunner.engines.exit_reason import last_words, signal_name

# The weight types a user's GGUF most often has; each runs its own kernels.
WEIGHT_TYPES = ("Q4_0", "Q4_1", "Q8_0", "Q4_K", "F16")
_FILE_TYPES = {
    "Q4_0": LlamaFileType.MOSTLY_Q4_0,
    "Q4_1": LlamaFileType.MOSTLY_Q4_1,
    "Q8_0": LlamaFileType.MOSTLY_Q8_0,
    "Q4_K": LlamaFileType.MOSTLY_Q4_K_M,
    "F16": LlamaFileType.MOSTLY_F16,
}
# Multiples of 256 (a K-quant block, and AMX's widest alignment) so that no kernel family skips a matmul.
N_EMBD = 256
N_FF = 512
N_HEAD = 4
N_LAYER = 1
N_VOCAB = 320
READY_TIMEOUT = 60.0  # a tiny model loads in well under a second; a loaded 2-core CI machine gets room
ANSWER_TIMEOUT = 60.0


@dataclass(frozen=True)
class SmokeResult:
    weight_type: str
    ok: bool
    signal: int | None = None  # the signal that ended llama-server, when one did
    detail: str = ""  # what went wrong otherwise (or the last lines it printed before dying)

    def describe(self) -> str:
        if self.ok:
            return f"{self.weight_type}: ok"
        if self.signal is not None:
            return f"{self.weight_type}: died by {signal_name(self.signal)}"
        return f"{self.weight_type}: {self.detail}"


def _vocabulary() -> tuple[list[str], list[int]]:
    """A small sentencepiece ("llama") vocabulary: control tokens, the 256 byte tokens, then letters."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL] + [TokenType.BYTE] * 256
    pieces = ["▁", *"abcdefghijklmnopqrstuvwxyz", *"0123456789"]
    pieces += [f"▁w{i}" for i in range(N_VOCAB - len(tokens) - len(pieces))]  # N_VOCAB in all
    return tokens + pieces, [int(t) for t in types] + [int(TokenType.NORMAL)] * len(pieces)


def _matrices() -> dict[str, tuple[int, int]]:
    """Weight matrices of llama.cpp's llama architecture, numpy shapes (rows = output features)."""
    shapes = {"token_embd.weight": (N_VOCAB, N_EMBD), "output.weight": (N_VOCAB, N_EMBD)}
    for i in range(N_LAYER):
        for part in ("attn_q", "attn_k", "attn_v", "attn_output"):
            shapes[f"blk.{i}.{part}.weight"] = (N_EMBD, N_EMBD)
        shapes[f"blk.{i}.ffn_gate.weight"] = (N_FF, N_EMBD)
        shapes[f"blk.{i}.ffn_up.weight"] = (N_FF, N_EMBD)
        shapes[f"blk.{i}.ffn_down.weight"] = (N_EMBD, N_FF)
    return shapes


def _q4_k_blocks(rows: int, columns: int, rng: np.random.Generator) -> np.ndarray:
    """Random Q4_K data (gguf-py cannot quantize to it): per 256 weights a 144-byte block of two float16
    scales (d, dmin), 12 bytes of 6-bit sub-block scales and 128 bytes of 4-bit values."""
    blocks = rows * columns // 256
    scales = np.array([0.002, 0.001], dtype=np.float16).view(np.uint8)
    data = rng.integers(0, 256, size=(blocks, 144), dtype=np.uint8)
    data[:, :4] = scales
    return data.reshape(rows, columns // 256 * 144)


def write_smoke_model(path: Path, weight_type: str, seed: int = 0) -> Path:
    """A ~0.2-1 MB llama GGUF whose matrices are all of weight_type (norms stay F32, as in real files)."""
    rng = np.random.default_rng(seed)
    qtype = GGMLQuantizationType[weight_type]
    tokens, types = _vocabulary()
    writer = GGUFWriter(path, "llama")
    writer.add_name(f"smoke-{weight_type.lower()}")
    writer.add_file_type(_FILE_TYPES[weight_type])
    writer.add_context_length(256)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(N_LAYER)
    writer.add_feed_forward_length(N_FF)
    writer.add_rope_dimension_count(N_EMBD // N_HEAD)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * 259 + [-float(i) for i in range(len(tokens) - 259)])
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    for name, (rows, columns) in _matrices().items():
        if weight_type == "Q4_K":
            writer.add_tensor(name, _q4_k_blocks(rows, columns, rng), raw_dtype=qtype)
            continue
        weights = (rng.standard_normal((rows, columns)) * 0.02).astype(np.float32)
        if weight_type == "F16":
            writer.add_tensor(name, weights.astype(np.float16))
        else:
            writer.add_tensor(name, quantize(weights, qtype), raw_dtype=qtype)
    for i in range(N_LAYER):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    writer.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _output_tail(log: Path) -> str:
    """What llama-server said before it ended, in exit_reason's choice of lines (errors, its last words)."""
    try:
        return last_words(log.read_text(errors="replace"))
    except OSError:
        return ""


def _answers(server: Path, model: Path, work: Path, threads: int) -> SmokeResult:
    """Start llama-server on model, ask for a few tokens, stop it; how it went."""
    weight_type = model.stem
    socket, log = work / f"{weight_type}.sock", work / f"{weight_type}.log"
    argv = [str(server), "--model", str(model), "--host", str(socket), "-t", str(threads), "-ngl", "0"]
    argv += ["--ctx-size", "256", "--no-webui"]
    with open(log, "wb") as out:
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
    try:
        transport = httpx.HTTPTransport(uds=str(socket))
        with httpx.Client(transport=transport, base_url="http://engine", timeout=ANSWER_TIMEOUT) as client:
            deadline = time.monotonic() + READY_TIMEOUT
            while True:
                if process.poll() is not None:
                    return _ended(weight_type, process.returncode, log)
                if time.monotonic() > deadline:
                    return SmokeResult(weight_type, False, detail=f"not ready after {READY_TIMEOUT:.0f} s")
                with contextlib.suppress(httpx.TransportError):
                    if client.get("/health").status_code == 200:
                        break
                time.sleep(0.05)
            body = {"prompt": "hello world", "n_predict": 4, "temperature": 0}
            try:
                answer = client.post("/completion", json=body)
            except httpx.TransportError:
                process.wait(timeout=10)
                return _ended(weight_type, process.returncode, log)
            if answer.status_code != 200 or answer.json().get("tokens_predicted", 0) < 1:
                return SmokeResult(weight_type, False, detail=f"answered {answer.status_code}, no tokens")
            return SmokeResult(weight_type, True)
    except subprocess.TimeoutExpired:
        return SmokeResult(weight_type, False, detail="the connection closed but the engine kept running")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def _ended(weight_type: str, returncode: int, log: Path) -> SmokeResult:
    if returncode < 0:
        return SmokeResult(weight_type, False, signal=-returncode, detail=_output_tail(log))
    return SmokeResult(weight_type, False, detail=f"exited with code {returncode}: {_output_tail(log)}")


def run_smoke_test(
    server: Path, threads: int, progress: Callable[[str], None], weight_types: tuple[str, ...] = WEIGHT_TYPES
) -> list[SmokeResult]:
    """Each weight type's model answered (or not) by server; a few seconds in all."""
    progress(f"Proving the build: a few tokens from a small {', '.join(weight_types)} model each")
    results = []
    with tempfile.TemporaryDirectory(prefix="modelrunner-smoke-") as folder:
        work = Path(folder)
        for weight_type in weight_types:
            model = write_smoke_model(work / f"{weight_type}.gguf", weight_type)
            results.append(_answers(server, model, work, threads))
    return results
