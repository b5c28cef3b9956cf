"""The trust policy file and its patterns (signing/policy.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from modelrunner.reference import parse_reference
from modelrunner.signing import keys
from modelrunner.signing.policy import (
    InvalidPolicy,
    Rule,
    load_rules,
    normalise_pattern,
    remove_rule,
    rule_for,
    set_rule,
)

PEM = keys.public_pem(ec.generate_private_key(ec.SECP256R1()).public_key()).decode()


def test_patterns_are_normalised_references() -> None:
    assert normalise_pattern("myorg/model") == "docker.io/myorg/model"
    assert normalise_pattern("smollm2") == "docker.io/ai/smollm2"
    assert normalise_pattern("Docker.io/MyOrg/*") == "docker.io/myorg/*"
    assert normalise_pattern("hf.co/*") == "huggingface.co/*"
    assert normalise_pattern("myorg/*") == "docker.io/myorg/*"
    assert normalise_pattern("*") == "*"
    for bad in ("", "a b", "myorg/model:v2", "a//b"):
        with pytest.raises(InvalidPolicy):
            normalise_pattern(bad)


def test_the_longest_matching_pattern_wins(tmp_path: Path) -> None:
    path = tmp_path / "trust-policy.json"
    set_rule(path, Rule("*", (PEM,), "warn"))
    set_rule(path, Rule("docker.io/myorg/*", (PEM,), "enforce"))
    set_rule(path, Rule("docker.io/myorg/open", (), "off"))
    rules = load_rules(path)

    def mode(text: str) -> str:
        return (rule_for(rules, parse_reference(text)) or Rule("", (), "none")).mode

    assert mode("myorg/model:v1") == "enforce"
    assert mode("myorg/open") == "off"
    assert mode("hf.co/org/repo") == "warn"
    set_rule(path, Rule("*", (PEM,), "enforce"))  # replaces the rule of the same pattern
    assert [r.mode for r in load_rules(path) if r.pattern == "*"] == ["enforce"]
    remove_rule(path, "*")
    assert rule_for(load_rules(path), parse_reference("other/model")) is None
    with pytest.raises(InvalidPolicy, match="no trust rule"):
        remove_rule(path, "*")


def test_no_policy_file_is_no_rules(tmp_path: Path) -> None:
    assert load_rules(tmp_path / "absent.json") == []


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"{", "not JSON"),
        (b"[]", "no list of rules"),
        (json.dumps({"rules": ["x"]}).encode(), "not an object"),
        (json.dumps({"rules": [{"pattern": "*", "keys": [PEM], "mode": "strict"}]}).encode(), "a mode"),
        (
            json.dumps({"rules": [{"pattern": "*", "keys": [], "mode": "enforce"}]}).encode(),
            "PEM public keys",
        ),
        (json.dumps({"rules": [{"pattern": "*", "keys": ["not a key"], "mode": "warn"}]}).encode(), "PEM"),
        (b" " * (1024 * 1024 + 1), "too large"),
    ],
)
def test_a_policy_file_that_is_not_valid_is_a_clear_error(
    tmp_path: Path, content: bytes, problem: str
) -> None:
    path = tmp_path / "trust-policy.json"
    path.write_bytes(content)
    with pytest.raises(InvalidPolicy, match=problem):
        load_rules(path)
    with pytest.raises(InvalidPolicy):
        set_rule(path, Rule("*", (PEM,), "warn"))
    assert path.read_bytes() == content  # nothing changed


def test_a_hugging_face_pull_under_enforce_is_refused_before_anything_is_fetched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from modelrunner.distribution.progress import ProgressReporter
    from modelrunner.signing.enforce import check_unsigned_source
    from modelrunner.signing.policy import UntrustedModel

    monkeypatch.setenv("MODEL_RUNNER_HOME", str(tmp_path))
    events: list[dict[str, object]] = []
    reporter = ProgressReporter(events.append, "pull")
    reference = parse_reference("hf.co/org/repo")
    check_unsigned_source(reference, reporter)  # no policy: nothing to say
    set_rule(tmp_path / "trust-policy.json", Rule("hf.co/*", (PEM,), "warn"))
    check_unsigned_source(reference, reporter)
    assert [e["type"] for e in events] == ["warning"]
    set_rule(tmp_path / "trust-policy.json", Rule("hf.co/*", (PEM,), "enforce"))
    with pytest.raises(UntrustedModel, match="carry no signature"):
        check_unsigned_source(reference, reporter)
