"""Model reference parsing and normalisation (DMR's normalizeModelName and oci/reference.ParseReference,
plus Docker's grammar). Upstream's own cases are in tests/conformance/test_store_references.py."""

from __future__ import annotations

import dataclasses

import pytest

from modelrunner.errors import InvalidDigest, InvalidReference
from modelrunner.reference import (
    Reference,
    parse_model_id,
    parse_reference,
    same_reference,
)

HEX = "0123456789abcdef" * 4
DIGEST = f"sha256:{HEX}"


@pytest.fixture(autouse=True)
def _docker_hub_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DEFAULT_REGISTRY", raising=False)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("smollm2", "docker.io/ai/smollm2:latest"),
        ("  smollm2\n", "docker.io/ai/smollm2:latest"),
        ("SmolLM2", "docker.io/ai/smollm2:latest"),
        ("ai/smollm2", "docker.io/ai/smollm2:latest"),
        ("ai/smollm2:360M-Q4_K_M", "docker.io/ai/smollm2:360M-Q4_K_M"),
        ("smollm2:v1", "docker.io/ai/smollm2:v1"),
        ("myorg/model", "docker.io/myorg/model:latest"),
        ("docker.io/ai/x", "docker.io/ai/x:latest"),
        ("registry-1.docker.io/ai/x:v2", "registry-1.docker.io/ai/x:v2"),  # no alias in DMR either
        ("docker.io/x", "docker.io/ai/x:latest"),  # a one-component Hub name gets ai/ (ParseReference)
        ("index.docker.io/x:v1", "docker.io/ai/x:v1"),
        ("docker.io/library/x", "docker.io/library/x:latest"),
        ("registry.example.com/x", "registry.example.com/x:latest"),
        ("x:", "docker.io/ai/x:latest"),  # an empty tag is :latest (normalizeModelName)
        ("docker.io/ai/x", "docker.io/ai/x:latest"),
        ("DOCKER.IO/AI/SmolLM2:V1", "docker.io/ai/smollm2:V1"),
        ("localhost:5000/foo/bar:v1", "localhost:5000/foo/bar:v1"),
        ("localhost/foo", "localhost/foo:latest"),
        ("LocalHost:5000/foo", "localhost:5000/foo:latest"),
        ("host:05000/x", "host:5000/x:latest"),
        ("127.0.0.1:5000/a/b", "127.0.0.1:5000/a/b:latest"),
        ("[::1]:5000/a", "[::1]:5000/a:latest"),
        ("[0:0::1]/a", "[::1]/a:latest"),
        ("registry.example.com/team/sub/model:1.0", "registry.example.com/team/sub/model:1.0"),
        ("hf.co/Org/Repo:Q4_K_M", "huggingface.co/org/repo:Q4_K_M"),
        ("HF.CO/Org/Repo", "huggingface.co/org/repo:latest"),
        (
            "huggingface.co/bartowski/Llama-3.2-1B-Instruct-GGUF",
            "huggingface.co/bartowski/llama-3.2-1b-instruct-gguf:latest",
        ),
        ("a__b/c-d.e_f--g", "docker.io/a__b/c-d.e_f--g:latest"),
        (f"ai/x@{DIGEST}", f"docker.io/ai/x@{DIGEST}"),
        (f"x:v1@{DIGEST}", f"docker.io/ai/x:v1@{DIGEST}"),
        ("0123456789ab", "docker.io/ai/0123456789ab:latest"),  # a name here; IDs go via parse_model_id
        ("ai/x:" + "T" * 128, "docker.io/ai/x:" + "T" * 128),
        ("ai/x:_under.score-1", "docker.io/ai/x:_under.score-1"),
    ],
)
def test_normalises(text: str, expected: str) -> None:
    assert str(parse_reference(text)) == expected


def test_fields_of_a_docker_hub_reference() -> None:
    ref = parse_reference("ai/SmolLM2:360M-Q4_K_M")
    assert ref == Reference("docker.io", "ai/smollm2", "360M-Q4_K_M", None, "ai/SmolLM2")
    assert ref.original_repository == "ai/SmolLM2"
    assert ref.name == "docker.io/ai/smollm2"
    assert not ref.is_huggingface


def test_hugging_face_keeps_the_tag_case_and_the_typed_repository() -> None:
    ref = parse_reference("hf.co/Org/Repo:Q4_K_M")
    assert ref.registry == "huggingface.co"
    assert ref.repository == "org/repo"
    assert ref.original_repository == "Org/Repo"
    assert ref.tag == "Q4_K_M"
    assert ref.is_huggingface
    assert ref.name == "huggingface.co/org/repo"


def test_digest_only_reference_has_no_tag() -> None:
    ref = parse_reference(f"ai/x@{DIGEST}")
    assert (ref.tag, ref.digest) == (None, DIGEST)
    both = parse_reference(f"ai/x:t@{DIGEST}")
    assert (both.tag, both.digest) == ("t", DIGEST)


def test_equality_ignores_original_spelling_and_reference_is_frozen() -> None:
    a, b = parse_reference("hf.co/Org/Repo:Q4_K_M"), parse_reference("huggingface.co/org/repo:Q4_K_M")
    assert a == b
    assert a != parse_reference("huggingface.co/org/repo:q4_k_m")  # tags are case-sensitive, as in DMR
    assert hash(a) == hash(b)
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.tag = "other"  # type: ignore[misc]


def test_default_registry_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEFAULT_REGISTRY", "registry.local:5000")
    assert str(parse_reference("smollm2")) == "registry.local:5000/ai/smollm2:latest"
    assert str(parse_reference("org/model:v1")) == "registry.local:5000/org/model:v1"
    ref = parse_reference("registry.local:5000/a")
    assert (ref.registry, ref.repository, ref.tag) == ("registry.local:5000", "a", "latest")
    assert str(parse_reference("docker.io/ai/x")) == "docker.io/ai/x:latest"


def test_default_registry_argument_wins_and_is_normalised(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEFAULT_REGISTRY", "registry.local:5000")
    assert str(parse_reference("x", default_registry="docker.io")) == "docker.io/ai/x:latest"
    assert str(parse_reference("x", default_registry="Other.Example:443")) == "other.example:443/ai/x:latest"


def test_invalid_default_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEFAULT_REGISTRY", "bad_host:99999")
    with pytest.raises(InvalidReference, match="default registry"):
        parse_reference("smollm2")


LONG = "a" * 5000

INVALID = [
    ("empty", ""),
    ("blank", "   "),
    ("blank-newlines", "\t\n"),
    ("dotdot-leading", "../etc/passwd"),
    ("dotdot-middle", "ai/../x"),
    ("dotdot-trailing", "ai/x/.."),
    ("dotdot-alone", ".."),
    ("dot-leading", "./x"),
    ("dot-middle", "ai/./x"),
    ("dotdot-before-tag", "ai/..:v1"),
    ("percent-dotdot", "%2e%2e/x"),
    ("percent-space", "ai/smol%20lm"),
    ("absolute", "/etc/passwd"),
    ("backslash", "ai\\x"),
    ("backslash-traversal", "..\\..\\x"),
    ("nul", "ai/x\x00"),
    ("escape", "ai/\x1bx"),
    ("del", "ai/x\x7f"),
    ("c1-control", "ai/x\x85y"),
    ("inner-space", "ai/s mol"),
    ("inner-tab", "ai/s\tmol"),
    ("nbsp", "ai/x\u00a0y"),
    ("non-ascii", "ai/sm\u00f6llm"),
    ("kelvin-sign", "ai/\u212a"),
    ("double-slash", "a//b"),
    ("trailing-slash", "ai/x/"),
    ("trailing-at", "ai/x@"),
    ("no-name-tag", ":tag"),
    ("no-name-digest", f"@{DIGEST}"),
    ("two-ats", f"ai/x@@{DIGEST}"),
    ("two-digests", f"ai/x@{DIGEST}@{DIGEST}"),
    ("tag-too-long", "ai/x:" + "a" * 129),
    ("tag-leading-dash", "ai/x:-bad"),
    ("tag-leading-dot", "ai/x:.bad"),
    ("tag-bad-char", "ai/x:ta$g"),
    ("two-tags", "ai/x:v1:v2"),
    ("digest-uppercase", f"ai/x@sha256:{HEX.upper()}"),
    ("digest-short", "ai/x@sha256:abc"),
    ("digest-non-hex", "ai/x@sha256:" + "g" * 64),
    ("digest-md5", "ai/x@md5:" + "a" * 32),
    ("digest-sha512", "ai/x@sha512:" + "a" * 128),
    ("digest-upper-algorithm", f"ai/x@SHA256:{HEX}"),
    ("digest-no-algorithm", f"ai/x@{HEX}"),
    ("name-too-long", "ai/" + "a" * 300),
    ("input-too-long", LONG),
    ("component-dollar", "ai/smol$lm"),
    ("component-leading-dash", "ai/-x"),
    ("component-trailing-dash", "ai/x-"),
    ("component-double-dot", "ai/x..y"),
    ("component-leading-underscore", "ai/_x"),
    ("component-triple-underscore", "ai/x___y"),
    ("port-too-big", "host:99999/x"),
    ("port-zero", "host:0/x"),
    ("port-empty", "host:/x"),
    ("port-not-number", "host:abc/x"),
    ("host-leading-dash", "-bad.host/x"),
    ("host-underscore", "bad_host.com/x"),
    ("host-empty-label", "a..b.com/x"),
    ("ipv4-out-of-range", "999.1.1.1/x"),
    ("ipv6-bad", "[::zz]:5000/x"),
    ("ipv6-unterminated", "[::1/x"),
    ("ipv6-junk-after", "[::1]x/y"),
    ("model-id-full", DIGEST),
    ("model-id-bare-64", HEX),
    ("model-id-broken", "sha256:xyz"),
]


@pytest.mark.parametrize("text", [text for _, text in INVALID], ids=[name for name, _ in INVALID])
def test_rejects(text: str) -> None:
    with pytest.raises(InvalidReference) as caught:
        parse_reference(text)
    message = str(caught.value)
    assert message
    assert len(message) < 300
    assert caught.value.status_code == 400


def test_long_input_is_not_echoed_whole() -> None:
    with pytest.raises(InvalidReference) as caught:
        parse_reference("ai/" + "b" * 3000)
    assert "b" * 100 not in str(caught.value)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("../x", "'..'"),
        ("%2e%2e/x", "percent"),
        ("/etc/passwd", "absolute"),
        ("ai\\x", "backslash"),
        ("ai/x\x00", "control"),
        ("ai/x:ta$g", "tag"),
        ("ai/x@", "digest"),
        (f"ai/x@sha256:{HEX.upper()}", "lowercase"),
        ("host:99999/x", "port"),
        ("ai/smol$lm", "smol$lm"),
        (DIGEST, "model ID"),
    ],
)
def test_message_names_the_problem(text: str, fragment: str) -> None:
    with pytest.raises(InvalidReference, match=fragment.replace("$", r"\$")):
        parse_reference(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (DIGEST, DIGEST),
        (f"  {DIGEST} ", DIGEST),
        (HEX, DIGEST),
        (HEX[:12], f"sha256:{HEX[:12]}"),
        (f"sha256:{HEX[:12]}", f"sha256:{HEX[:12]}"),
        ("smollm2", None),
        ("ai/smollm2:latest", None),
        (HEX[:11], None),
        (HEX[:13], None),
        (HEX.upper(), None),  # IDs are lowercase; this is not one
        ("", None),
    ],
)
def test_parse_model_id(text: str, expected: str | None) -> None:
    assert parse_model_id(text) == expected


@pytest.mark.parametrize(
    "text", [f"sha256:{HEX.upper()}", "sha256:abc", "SHA256:" + HEX, "sha256:" + HEX + "0", "sha256:"]
)
def test_parse_model_id_rejects_broken_digests(text: str) -> None:
    with pytest.raises(InvalidDigest):
        parse_model_id(text)


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        ("ai/smollm2", "smollm2", True),
        ("smollm2", "docker.io/ai/smollm2:latest", True),
        ("docker.io/ai/smollm2", "ai/smollm2:latest", True),
        ("index.docker.io/ai/smollm2", "SmolLM2", True),
        ("docker.io/smollm2", "SmolLM2", True),
        ("hf.co/Org/Repo:Q4_K_M", "huggingface.co/org/repo:Q4_K_M", True),
        ("hf.co/Org/Repo:Q4_K_M", "huggingface.co/org/repo:q4_k_m", False),
        ("localhost:05000/x", "localhost:5000/x:latest", True),
        (f"ai/x@{DIGEST}", f"x@{DIGEST}", True),
        ("smollm2", "smollm2:v1", False),
        ("ai/smollm2:V1", "ai/smollm2:v1", False),  # tag case matters outside Hugging Face
        ("smollm2", "other/smollm2", False),
        ("smollm2", "localhost:5000/ai/smollm2", False),
        (f"ai/x@{DIGEST}", "ai/x", False),
        (f"ai/x:latest@{DIGEST}", f"ai/x@{DIGEST}", False),
        ("ai/x", "../x", False),
        ("", "", False),
    ],
)
def test_same_reference(a: str, b: str, same: bool) -> None:
    assert same_reference(a, b) is same
    assert same_reference(b, a) is same


def test_same_reference_follows_default_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEFAULT_REGISTRY", "registry.local:5000")
    assert same_reference("smollm2", "registry.local:5000/ai/smollm2:latest")
    assert not same_reference("smollm2", "docker.io/ai/smollm2:latest")
