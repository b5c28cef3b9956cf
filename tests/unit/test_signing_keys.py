"""cosign's key formats and simple-signing payload (signing/keys.py, signing/payload.py)."""

from __future__ import annotations

import base64
import json
import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from modelrunner.signing import keys
from modelrunner.signing.payload import InvalidSignature, make_payload, parse_payload

DIGEST = "sha256:" + "ab" * 32
BEGIN, END = "-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----", "-----END ENCRYPTED SIGSTORE PRIVATE KEY-----"


def test_a_generated_pair_signs_and_verifies(tmp_path: Path) -> None:
    files = keys.write_key_pair(tmp_path / "cosign", b"secret")
    assert stat.S_IMODE(files.private.stat().st_mode) == 0o600
    pem = files.private.read_bytes()
    assert pem.startswith(b"-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----\n")
    document = json.loads(base64.b64decode(b"".join(pem.splitlines()[1:-1])))
    assert document["kdf"]["name"] == "scrypt" and document["cipher"]["name"] == "nacl/secretbox"
    private = keys.decrypt_private_key(pem, b"secret")
    public = keys.load_public_key(files.public.read_bytes())
    payload = make_payload("example.com/org/model:v1", DIGEST)
    signature = keys.sign(private, payload)
    assert keys.signature_valid(public, signature, payload)
    assert not keys.signature_valid(public, signature, payload + b" ")
    assert keys.key_id(public) == keys.key_id(private.public_key())


def test_keygen_never_replaces_a_file(tmp_path: Path) -> None:
    (tmp_path / "cosign.pub").write_text("mine")
    with pytest.raises(keys.InvalidKey, match="exists already"):
        keys.write_key_pair(tmp_path / "cosign", b"")
    assert (tmp_path / "cosign.pub").read_text() == "mine"
    assert not (tmp_path / "cosign.key").exists()


def test_a_wrong_password_is_a_clear_error(tmp_path: Path) -> None:
    files = keys.write_key_pair(tmp_path / "k", b"right")
    with pytest.raises(keys.InvalidKey, match=r"wrong password.*COSIGN_PASSWORD"):
        keys.decrypt_private_key(files.private.read_bytes(), b"wrong")


def _encrypted(document: object) -> bytes:
    body = base64.b64encode(json.dumps(document).encode()).decode()
    return f"{BEGIN}\n{body}\n{END}\n".encode()


def _document(**kdf_params: int) -> dict[str, object]:
    params = {"N": 32768, "r": 8, "p": 1, **kdf_params}
    salt = base64.b64encode(b"s" * 32).decode()
    nonce = base64.b64encode(b"n" * 24).decode()
    return {
        "kdf": {"name": "scrypt", "params": params, "salt": salt},
        "cipher": {"name": "nacl/secretbox", "nonce": nonce},
        "ciphertext": base64.b64encode(b"x" * 40).decode(),
    }


@pytest.mark.parametrize(
    ("pem", "problem"),
    [
        (b"", "not a cosign private key"),
        (b"-----BEGIN EC PRIVATE KEY-----\nAAAA\n-----END EC PRIVATE KEY-----\n", "not a cosign private key"),
        (b"-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----\nAAAA\n", "no end line"),
        (
            f"{BEGIN}\n!!\n{END}".encode(),
            "base64",
        ),
        (_encrypted("just a string"), "no kdf.name"),
        (_encrypted(_document(N=1 << 30)), "out of bounds"),  # scrypt would want 1 TiB of memory
        (_encrypted(_document(N=1000)), "out of bounds"),  # not a power of two
        (_encrypted(_document(r=True)), "not integers"),
        (_encrypted({**_document(), "ciphertext": 5}), "not a string"),
        (_encrypted({**_document(), "cipher": {"name": "aes", "nonce": ""}}), "other than scrypt"),
    ],
)
def test_a_private_key_in_a_wrong_format_is_refused(pem: bytes, problem: str) -> None:
    with pytest.raises(keys.InvalidKey, match=problem):
        keys.decrypt_private_key(pem, b"")


def test_a_sealed_key_of_another_curve_is_refused() -> None:
    other = ec.generate_private_key(ec.SECP384R1())
    with pytest.raises(keys.InvalidKey, match="not an ECDSA P-256 key"):
        keys.decrypt_private_key(keys.encrypt_private_key(other, b""), b"")


@pytest.mark.parametrize(
    "pem",
    [
        b"not a key",
        ec.generate_private_key(ec.SECP384R1())
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo),
        rsa.generate_private_key(65537, 2048)
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo),
    ],
)
def test_a_public_key_in_a_wrong_format_is_refused(pem: bytes) -> None:
    with pytest.raises(keys.InvalidKey):
        keys.load_public_key(pem)


def test_the_payload_is_cosigns() -> None:
    payload = make_payload("example.com/org/model:v1", DIGEST)
    assert json.loads(payload) == {
        "critical": {
            "identity": {"docker-reference": "example.com/org/model:v1"},
            "image": {"docker-manifest-digest": DIGEST},
            "type": "cosign container image signature",
        },
        "optional": None,
    }
    claim = parse_payload(payload)
    assert (claim.docker_reference, claim.manifest_digest) == ("example.com/org/model:v1", DIGEST)


@pytest.mark.parametrize(
    ("payload", "problem"),
    [
        (b"{", "not JSON"),
        (b"x" * (64 * 1024 + 1), "too large"),
        (json.dumps({"critical": {"type": "other"}}).encode(), "not a cosign container image signature"),
        (make_payload("example.com/m", "sha256:ABC"), "not sha256"),
        (json.dumps({"critical": {"type": "cosign container image signature"}}).encode(), "no reference"),
    ],
)
def test_a_bad_payload_is_refused(payload: bytes, problem: str) -> None:
    with pytest.raises(InvalidSignature, match=problem):
        parse_payload(payload)
