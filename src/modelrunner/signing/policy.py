"""The trust policy: which keys (or keyless identities: signing/keyless.py) must have signed a model, by
reference pattern, and what a missing or bad signature does (`enforce` refuses, `warn` says so, `off` does
not look). One JSON file in the runner home, written by `model trust set/rm`, read by the daemon on every
pull and load; a file (or folder) that another user owns or may write in is refused, not obeyed.

Patterns match normalised references without tag or digest (`docker.io/myorg/model`), `*` matching any
characters (`/` included): `docker.io/myorg/*`, `hf.co/*`, `*`. The longest matching pattern wins.
"""

from __future__ import annotations

import fnmatch
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modelrunner.errors import BadRequest, InvalidReference, ModelRunnerError
from modelrunner.reference import Reference, parse_reference
from modelrunner.scheduler.rundir import not_private
from modelrunner.signing import keys

POLICY_FILE = "trust-policy.json"
MODES = ("enforce", "warn", "off")
MAX_POLICY_BYTES = 1024 * 1024


class InvalidPolicy(BadRequest):
    """A policy file, pattern or mode that does not hold."""


class UntrustedModel(ModelRunnerError):
    """A model the policy enforces a signature on, without a valid one."""

    status_code = 403


@dataclass(frozen=True)
class Rule:
    pattern: str
    keys: tuple[str, ...]  # PEM public keys
    mode: str
    # keyless signers instead of (or beside) keys: (certificate identity, OIDC issuer) pairs, checked
    # against `trusted_root` (trusted_root.json's text; None: Sigstore's public-good instance)
    identities: tuple[tuple[str, str], ...] = ()
    trusted_root: str | None = None

    def public_keys(self) -> list[Any]:
        return [keys.load_public_key(pem.encode()) for pem in self.keys]

    def to_json(self) -> dict[str, Any]:
        document: dict[str, Any] = {"pattern": self.pattern, "keys": list(self.keys), "mode": self.mode}
        if self.identities:  # absent otherwise: a rule of keys reads as before
            document["identities"] = [{"identity": i, "issuer": o} for i, o in self.identities]
            document["trustedRoot"] = self.trusted_root
        return document


def policy_path(home: Path) -> Path:
    return home / POLICY_FILE


def normalise_pattern(text: str) -> str:
    """A pattern as rules store it: a reference without wildcards is normalised (`myorg/m` ->
    `docker.io/myorg/m`); one with `*` is kept, lowercased, as registries' names are."""
    text = text.strip()
    if not text or len(text) > 512 or any(c.isspace() or ord(c) < 32 for c in text):
        raise InvalidPolicy(f"invalid pattern {text[:80]!r}")
    if "*" in text or "?" in text or "[" in text:
        return _normalise_wildcard(text.lower())
    try:
        reference = parse_reference(text)
    except InvalidReference as exc:
        raise InvalidPolicy(f"invalid pattern: {exc.message}") from None
    if reference.tag not in (None, "latest") or reference.digest:
        raise InvalidPolicy("a pattern names a repository, without tag or digest")
    return reference.name


def _normalise_wildcard(pattern: str) -> str:
    """`hf.co/*` -> `huggingface.co/*`, `myorg/*` -> `docker.io/myorg/*`: the registry part as references
    normalise it (the reference module's rule, through a name parsed with it); `*` alone stays."""
    head, slash, rest = pattern.partition("/")
    if not slash or any(c in head for c in "*?["):
        return pattern
    if "." in head or ":" in head or head == "localhost":
        try:
            return f"{parse_reference(f'{head}/a/b').registry}/{rest}"
        except InvalidReference as exc:
            raise InvalidPolicy(f"invalid pattern: {exc.message}") from None
    return f"{parse_reference('a/b').registry}/{pattern}"


def _rule(raw: Any, index: int) -> Rule:
    if not isinstance(raw, dict):
        raise InvalidPolicy(f"the trust policy's rule {index} is not an object")
    pattern, pems, mode = raw.get("pattern"), raw.get("keys"), raw.get("mode")
    if not isinstance(pattern, str) or mode not in MODES:
        raise InvalidPolicy(
            f"the trust policy's rule {index} needs a pattern and a mode ({', '.join(MODES)})"
        )
    identities = _identities(raw, index)
    if (
        not isinstance(pems, list)
        or not all(isinstance(p, str) for p in pems)
        or (mode != "off" and not pems and not identities)
    ):
        raise InvalidPolicy(f"the trust policy's rule {index} needs a list of PEM public keys or identities")
    trusted_root = raw.get("trustedRoot")
    if trusted_root is not None and not isinstance(trusted_root, str):
        raise InvalidPolicy(f"the trust policy's rule {index}: trustedRoot is not trusted_root.json's text")
    rule = Rule(normalise_pattern(pattern), tuple(pems), mode, identities, trusted_root)
    try:
        rule.public_keys()
    except keys.InvalidKey as exc:
        raise InvalidPolicy(f"the trust policy's rule {index} ({rule.pattern}): {exc.message}") from None
    return rule


def _identities(raw: dict[str, Any], index: int) -> tuple[tuple[str, str], ...]:
    listed = raw.get("identities", [])
    if not isinstance(listed, list) or not all(isinstance(i, dict) for i in listed):
        raise InvalidPolicy(f"the trust policy's rule {index}: identities is not a list of objects")
    pairs = [(i.get("identity"), i.get("issuer")) for i in listed]
    if not all(isinstance(i, str) and i and isinstance(o, str) and o for i, o in pairs):
        raise InvalidPolicy(f"the trust policy's rule {index}: each identity needs an identity and an issuer")
    return tuple((str(i), str(o)) for i, o in pairs)


def load_rules(path: Path) -> list[Rule]:
    """The rules of a policy file ([] when there is none); InvalidPolicy for a file that does not hold."""
    try:
        with open(path, "rb") as handle:
            _refuse_if_others_may_change(path, os.fstat(handle.fileno()))
            data = handle.read(MAX_POLICY_BYTES + 1)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise InvalidPolicy(f"cannot read the trust policy: {exc.strerror}") from None
    if len(data) > MAX_POLICY_BYTES:
        raise InvalidPolicy("the trust policy file is too large")
    try:
        document = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        raise InvalidPolicy(f"the trust policy ({POLICY_FILE}) is not JSON; fix or remove it") from None
    if not isinstance(document, dict) or not isinstance(document.get("rules"), list):
        raise InvalidPolicy(f"the trust policy ({POLICY_FILE}) has no list of rules")
    return [_rule(raw, i) for i, raw in enumerate(document["rules"])]


def _refuse_if_others_may_change(path: Path, st: os.stat_result) -> None:
    """A policy (or its folder) that another user could write is refused, never obeyed: its rules could be
    theirs. Refused rather than ignored, since an ignored policy would enforce nothing. The runtime
    directory's rule (scheduler/rundir.py), root's files accepted besides the daemon user's."""
    folder = path.parent
    problem = not_private(st, root_too=True)
    if problem is None:
        problem = not_private(os.stat(folder), root_too=True)
        path = folder
    if problem is not None:
        raise InvalidPolicy(
            f"refusing the trust policy: {path} {problem}, so another user could have changed it; "
            "make it yours alone (chown, chmod go-w) or remove it and set the rules again"
        )


def save_rules(path: Path, rules: list[Rule]) -> None:
    from modelrunner.fileio import write_file_atomic

    path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)  # not group-writable, whatever the umask
    document = {"rules": [rule.to_json() for rule in sorted(rules, key=lambda r: r.pattern)]}
    write_file_atomic(path, json.dumps(document, indent=2).encode() + b"\n")


def set_rule(path: Path, rule: Rule) -> None:
    rules = [r for r in load_rules(path) if r.pattern != rule.pattern]
    save_rules(path, [*rules, rule])


def remove_rule(path: Path, pattern: str) -> None:
    pattern = normalise_pattern(pattern)
    rules = load_rules(path)
    if not any(r.pattern == pattern for r in rules):
        raise InvalidPolicy(f"no trust rule for {pattern}")
    save_rules(path, [r for r in rules if r.pattern != pattern])


def rule_for(rules: list[Rule], reference: Reference) -> Rule | None:
    """The rule of the longest pattern that matches the reference's name."""
    matching = [r for r in rules if fnmatch.fnmatchcase(reference.name, r.pattern)]
    return max(matching, key=lambda r: len(r.pattern), default=None)
