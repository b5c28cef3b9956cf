"""Drafting from the context (engines/llamacpp_drafting.py) on a real llama-server with SmolLM2 (quantized):
`model configure --draft-from-context` gives the model's runner n-gram speculative decoding, an answer that
copies its prompt has drafts accepted, and `model ps`, `/engines/ps`, `/metrics` and the configuration say
so; a bad type is refused in words and changes nothing."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from modelrunner.embedded import smollm2_gguf
from tests.daemon import Daemon
from tests.engines import llama_daemon

pytestmark = pytest.mark.integration

# a text the model has read twice and is writing a third time: what follows its last tokens is in the prompt
VERSE = (
    "The river runs beneath the old stone bridge, past the mill and the baker's yard, under the willows where"
    " the children fish in summer, and on to the sea by the lighthouse on the northern cliffs."
)
COPYING = f"{VERSE}\n{VERSE}\n{VERSE[:60]}"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, llama_server: Path) -> Iterator[Daemon]:
    with llama_daemon(tmp_path_factory.mktemp("draft-from-context"), llama_server) as running:
        running.cli("package", "--gguf", str(smollm2_gguf()), "smol")
        yield running


def stored(daemon: Daemon) -> dict[str, object]:
    shown = json.loads(daemon.cli("configure", "show", "smol").stdout)
    config: dict[str, object] = shown[0]["Config"] if shown else {}
    return config


def test_a_copying_answer_is_drafted_and_every_view_says_so(daemon: Daemon) -> None:
    daemon.cli("configure", "--draft-from-context", "true", "smol")
    assert stored(daemon)["llamacpp"] == {"draft-from-context": "ngram-mod"}
    body = {"model": "smol", "prompt": COPYING, "max_tokens": 48, "temperature": 0}
    answer = daemon.http("POST", "/engines/v1/completions", json=body, timeout=300)
    assert answer.status_code == 200, answer.text

    (runner,) = daemon.http("GET", "/engines/ps").json()
    drafting = runner["drafting"]
    assert drafting["types"] == "ngram-mod"
    assert drafting["drafted_tokens"] > 0 and 0 < drafting["accepted_tokens"] <= drafting["drafted_tokens"]
    assert drafting["acceptance_rate"] == round(drafting["accepted_tokens"] / drafting["drafted_tokens"], 4)

    table = daemon.cli("ps").stdout.splitlines()
    assert "DRAFTING" in table[0]
    share = f"{drafting['accepted_tokens'] / drafting['drafted_tokens']:.0%}"
    assert f"ngram-mod: {share} of {drafting['drafted_tokens']:,} accepted" in table[1]

    metrics = daemon.http("GET", "/metrics").text
    accepted = [
        line
        for line in metrics.splitlines()
        if line.startswith("llamacpp:spec_decode_num_accepted_tokens_total{")
    ]
    assert len(accepted) == 1 and 'model="smol"' in accepted[0] and float(accepted[0].split()[-1]) > 0


def test_a_type_llama_cpp_drafts_without_the_context_is_refused_and_changes_nothing(daemon: Daemon) -> None:
    daemon.cli("configure", "--draft-from-context=ngram-simple", "smol")
    before = stored(daemon)
    refused = daemon.cli("configure", "--draft-from-context=ngram-cache", "smol", check=False)
    assert refused.returncode == 1
    assert (
        "draft-from-context must be true, false or one of ngram-mod, ngram-simple, ngram-map-k"
        in refused.stderr
    )
    assert stored(daemon) == before == {"llamacpp": {"draft-from-context": "ngram-simple"}}
    daemon.cli("configure", "--draft-from-context=false", "smol")
    assert "llamacpp" not in stored(daemon)
