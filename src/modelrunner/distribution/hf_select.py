"""Which files of a Hugging Face repository make the model (DMR's rules, contract 3.4).

GGUF repositories: the quantization named by the tag (default Q4_K_M, else the alphabetically first model
file), with all its shards, also when the quantization lives in a sub-folder named after it; the projector
(`mmproj`, preferring f16) separately. Safetensors repositories: weights plus the small files next to them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePosixPath

from modelrunner.errors import ModelNotFound

DEFAULT_QUANTIZATION = "Q4_K_M"
_SHARD = re.compile(r"^(?P<stem>.*)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)
_QUANT = re.compile(
    r"(?:^|[-._/])((?:I?Q\d+(?:_[A-Z0-9]+)*)|F16|F32|BF16|FP16|MXFP4)(?=[-._/]|$)", re.IGNORECASE
)
# Weights of other frameworks are never part of a safetensors model.
_SKIPPED_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".onnx", ".gguf", ".tflite", ".ot")


@dataclass(frozen=True)
class Selection:
    kind: str  # "gguf" or "safetensors"
    files: list[str]  # model files (GGUF shards in order) or every file of a safetensors model
    quantization: str | None = None
    default_used: bool = False
    mmproj: str | None = None
    chat_template: str | None = None

    @property
    def all_files(self) -> list[str]:
        """Everything to download, each once."""
        extra = [p for p in (self.mmproj, self.chat_template) if p]
        return list(dict.fromkeys([*self.files, *extra]))


def quantization_of(path: str) -> str | None:
    found = _QUANT.findall(path)
    return found[-1].upper() if found else None


def _matches(path: str, quant: str) -> bool:
    return re.search(rf"(?:^|[-._/]){re.escape(quant)}(?:[-._/]|$)", path, re.IGNORECASE) is not None


def _shard_set(chosen: str, candidates: list[str]) -> list[str]:
    match = _SHARD.match(chosen)
    if not match:
        return [chosen]
    stem, count = match.group("stem"), match.group("count")
    shards = sorted(
        p
        for p in candidates
        if (m := _SHARD.match(p)) and m.group("stem") == stem and m.group("count") == count
    )
    return shards


def _chat_template(paths: list[str]) -> str | None:
    """A Jinja template file, else tokenizer_config.json (whose `chat_template` key may hold one)."""
    for path in sorted(paths):
        name = PurePosixPath(path).name.lower()
        if name.endswith(".jinja") or name.startswith("chat_template"):
            return path
    return "tokenizer_config.json" if "tokenizer_config.json" in paths else None


def select_files(paths: list[str], tag: str | None, repo: str) -> Selection:
    """Raises ModelNotFound naming what the repository has when the tag matches nothing."""
    ggufs = sorted(p for p in paths if p.lower().endswith(".gguf"))
    if ggufs:
        return _select_gguf(ggufs, paths, tag, repo)
    if any(p.lower().endswith(".safetensors") for p in paths):
        files = sorted(
            p
            for p in paths
            if not any(part.startswith(".") for part in p.split("/"))
            and not p.lower().endswith(_SKIPPED_SUFFIXES)
        )
        return Selection(kind="safetensors", files=files)
    raise ModelNotFound(f"hf.co/{repo} has no GGUF or safetensors files")


def _select_gguf(ggufs: list[str], paths: list[str], tag: str | None, repo: str) -> Selection:
    projectors = [p for p in ggufs if "mmproj" in PurePosixPath(p).name.lower()]
    models = [p for p in ggufs if p not in projectors]
    if not models:
        raise ModelNotFound(f"hf.co/{repo} has only projector (mmproj) GGUF files")
    mmproj = next((p for p in projectors if "f16" in p.lower()), projectors[0] if projectors else None)
    template = _chat_template(paths)
    explicit = tag is not None and tag.lower() != "latest"
    wanted = tag if explicit and tag is not None else DEFAULT_QUANTIZATION
    matching = [p for p in models if _matches(p, wanted)]
    default_used = not explicit
    if not matching:
        if explicit or len(models) == 0:
            available = sorted({q for q in map(quantization_of, models) if q})
            raise ModelNotFound(
                f"no {wanted} in hf.co/{repo}; this repository has "
                + (", ".join(available) if available else "no recognisable quantizations")
            )
        matching = [models[0]]  # DMR: no default quantization either, so the alphabetically first
    files = _shard_set(matching[0], models)
    quant = quantization_of(files[0]) if not explicit else wanted.upper()
    return Selection(
        kind="gguf",
        files=files,
        quantization=quant,
        default_used=default_used,
        mmproj=mmproj,
        chat_template=template,
    )
