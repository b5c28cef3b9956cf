"""Which llama-server flags users may set through `model configure`, and checks on `LLAMA_ARGS`.

The allow-list is DMR's (`LlamaCppAllowedFlags`): flags that tune threads, context, batching, sampling,
devices, caches, templates and the server, never one that takes a file path. Stricter than DMR: the flags
that change the engine's own access rules (`--api-key`, `--api-prefix`, `--props`) are refused with the
reason, as are those that would let a request read files or lock clients out. Values are checked as
every engine's are (engines/runtime_flags.py).
"""

from __future__ import annotations

import shlex

from modelrunner.engines.runtime_flags import FlagRules
from modelrunner.errors import ModelRunnerError

ALLOWED_FLAGS = frozenset(
    {
        # threads and CPU placement
        *("-t", "--threads", "-tb", "--threads-batch", "-C", "--cpu-mask", "-Cr", "--cpu-range"),
        *("--cpu-strict", "--prio", "--poll", "-Cb", "--cpu-mask-batch", "-Crb", "--cpu-range-batch"),
        *("--cpu-strict-batch", "--prio-batch", "--poll-batch"),
        # context and prediction
        *("-c", "--ctx-size", "-n", "--predict", "--n-predict", "--keep"),
        # batching and performance
        *("-b", "--batch-size", "-ub", "--ubatch-size", "--swa-full", "-fa", "--flash-attn"),
        *("--perf", "--no-perf"),
        # sampling
        *("--samplers", "-s", "--seed", "--temp", "--temperature", "--top-k", "--top-p", "--min-p"),
        *("--top-nsigma", "--xtc-probability", "--xtc-threshold", "--typical", "--repeat-last-n"),
        *("--repeat-penalty", "--presence-penalty", "--frequency-penalty", "--dry-multiplier"),
        *("--dry-base", "--dry-allowed-length", "--dry-penalty-last-n", "--mirostat", "--mirostat-lr"),
        *("--mirostat-ent", "--ignore-eos", "--dynatemp-range", "--dynatemp-exp"),
        # devices and GPU layers
        *("-dev", "--device", "-ngl", "--gpu-layers", "--n-gpu-layers", "-sm", "--split-mode"),
        *("-ts", "--tensor-split", "-mg", "--main-gpu", "-fit", "--fit", "-fitt", "--fit-target"),
        *("-fitc", "--fit-ctx"),
        # memory and caches
        *("-kvo", "--kv-offload", "-nkvo", "--no-kv-offload", "--repack", "-nr", "--no-repack"),
        *("--no-host", "-ctk", "--cache-type-k", "-ctv", "--cache-type-v", "--mlock", "--mmap"),
        *("--no-mmap", "-dio", "--direct-io", "-ndio", "--no-direct-io", "-cram", "--cache-ram"),
        *("-kvu", "--kv-unified", "--context-shift", "--no-context-shift"),
        # RoPE and YaRN
        *("--rope-scaling", "--rope-scale", "--rope-freq-base", "--rope-freq-scale", "--yarn-orig-ctx"),
        *("--yarn-ext-factor", "--yarn-attn-factor", "--yarn-beta-slow", "--yarn-beta-fast"),
        # the server
        *("-np", "--parallel", "-cb", "--cont-batching", "-nocb", "--no-cont-batching", "--warmup"),
        *("--no-warmup", "-to", "--timeout", "--threads-http", "--cache-prompt", "--no-cache-prompt"),
        *("--cache-reuse", "--sleep-idle-seconds"),
        # multimodal, speculative decoding, LoRA, control vectors: only the flags without a file
        *("--mmproj-auto", "--no-mmproj", "--no-mmproj-auto", "--mmproj-offload", "--no-mmproj-offload"),
        *("--image-min-tokens", "--image-max-tokens", "--spm-infill"),
        *("--draft", "--draft-n", "--draft-max", "--draft-min", "--draft-n-min", "--draft-p-min"),
        *("-cd", "--ctx-size-draft", "-devd", "--device-draft", "-ngld", "--gpu-layers-draft"),
        *("--n-gpu-layers-draft", "-td", "--threads-draft", "-tbd", "--threads-batch-draft"),
        # ... and their names in llama.cpp b11434, with the draft-free n-gram kinds (`--spec-type`)
        *("--spec-type", "--spec-draft-n-max", "--spec-draft-n-min", "--spec-draft-p-min"),
        *("--spec-draft-p-split", "--spec-draft-sampling", "--spec-draft-ngl", "--spec-draft-threads"),
        *("--spec-ngram-mod-n-min", "--spec-ngram-mod-n-max", "--spec-ngram-mod-n-match"),
        *("--spec-ngram-simple-size-n", "--spec-ngram-simple-size-m", "--spec-ngram-simple-min-hits"),
        *("--lora-init-without-apply", "--control-vector-layer-range"),
        # grammar, templates, reasoning
        *("--grammar", "-j", "--json-schema", "-bs", "--backend-sampling"),
        *("--chat-template", "--chat-template-kwargs", "--jinja", "--no-jinja", "--pooling"),
        *("--reasoning-format", "--reasoning-budget", "--prefill-assistant", "--no-prefill-assistant"),
        # web UI and API (not --api-key, --api-prefix, --props: see REFUSED_FLAGS)
        *("--webui", "--no-webui", "--webui-config", "--metrics", "--no-metrics", "--slots", "--no-slots"),
        # embeddings, reranking
        *("--embedding", "--embeddings", "--rerank", "--reranking", "-sps", "--slot-prompt-similarity"),
        # tensors and computation
        *("-cmoe", "--cpu-moe", "-ncmoe", "--n-cpu-moe", "--check-tensors", "--op-offload"),
        "--no-op-offload",
        # logging
        *("-v", "--verbose"),
    }
)

_ACCESS = "it changes who may reach the engine or where (the model runner sets that itself)"
_FILES = "it lets requests read or write files on this machine"

# Flags refused whatever their value, with the reason: a configured model must stay reachable by every
# client of the model runner, under the model runner's own rules, and requests must not reach files.
REFUSED_FLAGS = {
    **dict.fromkeys(("--api-key", "--api-key-file", "--api-prefix", "--host", "--port"), _ACCESS),
    **dict.fromkeys(("--ssl-key-file", "--ssl-cert-file", "--reuse-port"), _ACCESS),
    **dict.fromkeys(("--path", "--media-path", "--slot-save-path", "--tools"), _FILES),
    "--props": "it lets a request change the engine's settings for every client",
}

# What the engine itself sets from the model and the runner: LLAMA_ARGS must leave them alone (DMR's rule).
RESERVED_IN_LLAMA_ARGS = frozenset(
    {"-m", "--model", "--host", "--embedding", "--embeddings", "-mm", "--mmproj"}
)

RUNTIME_FLAGS = FlagRules("llama.cpp", ALLOWED_FLAGS, REFUSED_FLAGS)


def llama_args_from_env(raw: str) -> list[str]:
    """`LLAMA_ARGS`, which replaces the default base arguments; the engine-owned flags are refused."""
    try:
        args = shlex.split(raw)
    except ValueError as exc:
        raise ModelRunnerError(
            f"LLAMA_ARGS cannot be parsed ({exc}): fix it and restart the model runner"
        ) from None
    for token in args:
        if token.split("=", 1)[0] in RESERVED_IN_LLAMA_ARGS:
            raise ModelRunnerError(
                f"LLAMA_ARGS may not contain {token.split('=', 1)[0]} (the model runner sets it): "
                "remove it and restart the model runner"
            )
    return args
