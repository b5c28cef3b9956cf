"""Trust rules that name keyless signers (an identity and its OIDC issuer) instead of keys (signing/policy.py,
signing/keyless.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from modelrunner.signing.policy import InvalidPolicy, Rule, load_rules, set_rule

ROOT = '{"mediaType": "application/vnd.dev.sigstore.trustedroot+json;version=0.1"}'


def test_a_rule_of_an_identity_round_trips_and_a_rule_of_keys_reads_as_before(tmp_path: Path) -> None:
    path = tmp_path / "trust-policy.json"
    keyless = Rule("docker.io/myorg/*", (), "enforce", (("dev@example.com", "https://issuer.example"),), ROOT)
    set_rule(path, keyless)
    set_rule(path, Rule("docker.io/open/*", (), "off"))
    assert load_rules(path) == [keyless, Rule("docker.io/open/*", (), "off")]
    written = json.loads(path.read_text())["rules"]
    assert written[0]["identities"] == [{"identity": "dev@example.com", "issuer": "https://issuer.example"}]
    assert written[0]["trustedRoot"] == ROOT
    assert set(written[1]) == {"pattern", "keys", "mode"}  # no keyless fields where there is no identity


@pytest.mark.parametrize(
    ("rule", "reason"),
    [
        ({"pattern": "*", "keys": [], "mode": "enforce"}, "needs a list of PEM public keys or identities"),
        ({"pattern": "*", "keys": [], "mode": "enforce", "identities": "x"}, "not a list of objects"),
        ({"pattern": "*", "keys": [], "mode": "warn", "identities": [{"identity": "a"}]}, "and an issuer"),
        (
            {"pattern": "*", "keys": [], "mode": "warn", "identities": [{"identity": "", "issuer": "b"}]},
            "needs an identity",
        ),
        (
            {
                "pattern": "*",
                "keys": [],
                "mode": "warn",
                "identities": [{"identity": "a", "issuer": "b"}],
                "trustedRoot": {"tlogs": []},
            },
            "trustedRoot is not trusted_root.json's text",
        ),
    ],
    ids=["no-signer", "identities-not-a-list", "no-issuer", "empty-identity", "root-not-text"],
)
def test_a_rule_of_identities_that_does_not_hold_is_a_clear_error(
    tmp_path: Path, rule: dict[str, object], reason: str
) -> None:
    path = tmp_path / "trust-policy.json"
    path.write_text(json.dumps({"rules": [rule]}))
    with pytest.raises(InvalidPolicy, match=reason):
        load_rules(path)
