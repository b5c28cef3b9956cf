"""Which `vllm serve` flags users may set through `model configure`: DMR's allow-list (`VLLMAllowedFlags`).

Parallelism, context and batching, data types and quantization, performance toggles, tokenizer mode and a
few others; never a flag that takes a file path, and not `--trust-remote-code` (DMR dropped it: it runs
code shipped with a model). Values are checked as every engine's are
(engines/runtime_flags.py).
"""

from __future__ import annotations

from modelrunner.engines.runtime_flags import FlagRules

ALLOWED_FLAGS = frozenset(
    {
        # parallelism
        *("-tp", "--tensor-parallel-size", "-pp", "--pipeline-parallel-size"),
        # model configuration
        *("--max-model-len", "--max-num-batched-tokens", "--max-num-seqs", "--block-size"),
        *("--swap-space", "--seed"),
        # data types and quantization
        *("--dtype", "--quantization", "-q", "--kv-cache-dtype"),
        # performance
        *("--enforce-eager", "--enable-prefix-caching", "--enable-chunked-prefill"),
        *("--disable-custom-all-reduce", "--use-v2-block-manager"),
        # tokenizer
        *("--tokenizer-mode", "--max-logprobs"),
        # tool calls: the parser of the model's call format (the engine passes Hermes' otherwise)
        "--tool-call-parser",
        # misc; the engine puts its own --served-model-name last, so a user's one cannot hide the model
        *("--revision", "--load-format", "--disable-log-stats", "--served-model-name"),
        "--gpu-memory-utilization",
    }
)

_ACCESS = "it changes who may reach the engine or where (the model runner sets that itself)"

# Refused whatever their value, with the reason (none is on the allow-list; the reason is the message).
REFUSED_FLAGS = {
    **dict.fromkeys(("--api-key", "--host", "--port", "--uds", "--root-path", "--allowed-origins"), _ACCESS),
    **dict.fromkeys(("--ssl-keyfile", "--ssl-certfile", "--ssl-ca-certs", "--ssl-cert-reqs"), _ACCESS),
    "--allowed-local-media-path": "it lets requests read files on this machine",
    "--middleware": "it runs code named by the flag inside the engine",
    "--trust-remote-code": "it runs code shipped with the model",
}

RUNTIME_FLAGS = FlagRules("vllm", ALLOWED_FLAGS, REFUSED_FLAGS)
