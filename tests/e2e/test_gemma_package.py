"""The real default model through the real CLI and daemon: what the quickstart does."""

from __future__ import annotations

import hashlib
from pathlib import Path

from tests.daemon import Daemon

GEMMA_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"


def test_package_gemma_and_read_its_metadata(daemon: Daemon, gemma_gguf: Path) -> None:
    packaged = daemon.cli("package", "--gguf", str(gemma_gguf), "--context-size", "2048", "gemma3:270m")
    assert packaged.stdout == "" and "Model loaded successfully" in packaged.stderr  # package.go: on stderr

    row = daemon.cli("ls").stdout.splitlines()[1].split()
    # DMR's values (format/gguf.go over gguf-parser-go v0.24.0): the file type's name, and the size of
    # the tensor data (253113024-byte file less its 6525120-byte aligned header) in gguf-parser's units
    assert row[:4] == ["gemma3:270m", "268.10M", "MOSTLY_Q4_K_M", "gemma3"]
    assert row[-2:] == ["2048", "235.16MiB"]

    [model] = daemon.models()
    gguf = model["config"]["gguf"]
    assert gguf["general.architecture"] == "gemma3"
    assert "tokenizer.ggml.tokens" not in gguf  # arrays over 50 elements are skipped, as DMR does

    bundle_file = daemon.store_root / "blobs" / "sha256" / GEMMA_SHA256
    assert hashlib.sha256(bundle_file.read_bytes()).hexdigest() == GEMMA_SHA256
