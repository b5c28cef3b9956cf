"""Key pairs in cosign's formats: ECDSA P-256, the public key as PEM (PKIX), the private key as an
`ENCRYPTED SIGSTORE PRIVATE KEY` PEM whose body is go-securesystemslib's `encrypted` JSON: scrypt derives a
key from the password, nacl/secretbox seals the PKCS#8 DER. cosign, skopeo and podman read and write these,
so a key made here signs for them and theirs for us.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from modelrunner.errors import BadRequest

PRIVATE_PEM_TYPES = ("ENCRYPTED SIGSTORE PRIVATE KEY", "ENCRYPTED COSIGN PRIVATE KEY")  # new, old cosign
WRITTEN_PEM_TYPE = PRIVATE_PEM_TYPES[0]
PASSWORD_VARIABLE = "COSIGN_PASSWORD"
# what cosign (v2, v3) writes: N=2^16, r=8, p=1 (read from a key cosign generated)
SCRYPT_N, SCRYPT_R, SCRYPT_P = 65536, 8, 1
SALT_BYTES, NONCE_BYTES, KEY_BYTES = 32, 24, 32
# A key file is read only within these bounds: a hostile file must not make scrypt take gigabytes or hours.
MAX_SCRYPT_N, MAX_SCRYPT_RP = 1 << 20, 16
MAX_KEY_FILE_BYTES = 64 * 1024


class InvalidKey(BadRequest):
    """A key file that is missing, malformed, of another kind, or that the password does not open."""


def password_from_environment() -> bytes:
    """COSIGN_PASSWORD as cosign reads it (an empty password is a password)."""
    return os.environ.get(PASSWORD_VARIABLE, "").encode()


def _pem_body(text: str, pem_type: str) -> bytes | None:
    begin, end = f"-----BEGIN {pem_type}-----", f"-----END {pem_type}-----"
    start = text.find(begin)
    if start < 0:
        return None
    stop = text.find(end, start)
    if stop < 0:
        raise InvalidKey(f"the key's PEM block has no end line ({pem_type})")
    try:
        return base64.b64decode("".join(text[start + len(begin) : stop].split()), validate=True)
    except ValueError:
        raise InvalidKey("the key's PEM block is not valid base64") from None


def _pem(pem_type: str, body: bytes) -> bytes:
    encoded = base64.b64encode(body).decode()
    lines = [encoded[i : i + 64] for i in range(0, len(encoded), 64)]
    return "\n".join([f"-----BEGIN {pem_type}-----", *lines, f"-----END {pem_type}-----", ""]).encode()


def _scrypt(password: bytes, salt: bytes, n: int, r: int, p: int) -> bytes:
    return hashlib.scrypt(password, salt=salt, n=n, r=r, p=p, dklen=KEY_BYTES, maxmem=256 * r * n + (1 << 20))


def encrypt_private_key(key: ec.EllipticCurvePrivateKey, password: bytes) -> bytes:
    """The private key as cosign writes it."""
    import nacl.secret

    der = key.private_bytes(
        serialization.Encoding.DER, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    salt, nonce = os.urandom(SALT_BYTES), os.urandom(NONCE_BYTES)
    secret = _scrypt(password, salt, SCRYPT_N, SCRYPT_R, SCRYPT_P)
    sealed = nacl.secret.SecretBox(secret).encrypt(der, nonce).ciphertext
    document = {
        "kdf": {
            "name": "scrypt",
            "params": {"N": SCRYPT_N, "r": SCRYPT_R, "p": SCRYPT_P},
            "salt": base64.b64encode(salt).decode(),
        },
        "cipher": {"name": "nacl/secretbox", "nonce": base64.b64encode(nonce).decode()},
        "ciphertext": base64.b64encode(sealed).decode(),
    }
    return _pem(WRITTEN_PEM_TYPE, json.dumps(document).encode())


def _field(document: Any, *path: str) -> Any:
    value = document
    for name in path:
        if not isinstance(value, dict) or name not in value:
            raise InvalidKey(f"the encrypted private key has no {'.'.join(path)}")
        value = value[name]
    return value


def _b64(value: Any, what: str) -> bytes:
    if not isinstance(value, str):
        raise InvalidKey(f"the encrypted private key's {what} is not a string")
    try:
        return base64.b64decode(value, validate=True)
    except ValueError:
        raise InvalidKey(f"the encrypted private key's {what} is not base64") from None


def decrypt_private_key(pem: bytes, password: bytes) -> ec.EllipticCurvePrivateKey:
    """A cosign private key file's key; InvalidKey for anything else, or a wrong password."""
    import nacl.exceptions
    import nacl.secret

    text = pem[:MAX_KEY_FILE_BYTES].decode("ascii", "replace")
    body = next((b for t in PRIVATE_PEM_TYPES if (b := _pem_body(text, t)) is not None), None)
    if body is None:
        raise InvalidKey("not a cosign private key (no ENCRYPTED SIGSTORE PRIVATE KEY block)")
    try:
        document = json.loads(body)
    except ValueError:
        raise InvalidKey("the encrypted private key is not JSON") from None
    if _field(document, "kdf", "name") != "scrypt" or _field(document, "cipher", "name") != "nacl/secretbox":
        raise InvalidKey("the private key is encrypted with something other than scrypt and nacl/secretbox")
    n, r, p = (_field(document, "kdf", "params", k) for k in ("N", "r", "p"))
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (n, r, p)):
        raise InvalidKey("the private key's scrypt parameters are not integers")
    if not (
        2 <= n <= MAX_SCRYPT_N and n & (n - 1) == 0 and 1 <= r <= MAX_SCRYPT_RP and 1 <= p <= MAX_SCRYPT_RP
    ):
        raise InvalidKey("the private key's scrypt parameters are out of bounds")
    salt = _b64(_field(document, "kdf", "salt"), "salt")
    nonce = _b64(_field(document, "cipher", "nonce"), "nonce")
    sealed = _b64(_field(document, "ciphertext"), "ciphertext")
    if len(nonce) != NONCE_BYTES:
        raise InvalidKey("the private key's nonce is not 24 bytes")
    try:
        der = nacl.secret.SecretBox(_scrypt(password, salt, n, r, p)).decrypt(sealed, nonce)
    except nacl.exceptions.CryptoError:
        raise InvalidKey(f"wrong password for the private key (set {PASSWORD_VARIABLE})") from None
    try:
        key = serialization.load_der_private_key(der, password=None)
    except ValueError:
        raise InvalidKey("the decrypted private key is not a PKCS#8 key") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.curve.name != "secp256r1":
        raise InvalidKey("the private key is not an ECDSA P-256 key")
    return key


def load_public_key(pem: bytes) -> ec.EllipticCurvePublicKey:
    """A PEM `PUBLIC KEY` (PKIX) of ECDSA P-256, as cosign writes `cosign.pub`."""
    try:
        key = serialization.load_pem_public_key(pem[:MAX_KEY_FILE_BYTES])
    except ValueError:
        raise InvalidKey("not a PEM public key (-----BEGIN PUBLIC KEY-----)") from None
    if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name != "secp256r1":
        raise InvalidKey("the public key is not an ECDSA P-256 key")
    return key


def public_pem(key: ec.EllipticCurvePublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def key_id(key: ec.EllipticCurvePublicKey) -> str:
    """A short, stable name of a public key: the SHA-256 of its DER (what the store records as signer)."""
    der = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return "sha256:" + hashlib.sha256(der).hexdigest()


def sign(key: ec.EllipticCurvePrivateKey, payload: bytes) -> bytes:
    """An ASN.1 DER ECDSA signature over SHA-256(payload), as cosign makes it."""
    return key.sign(payload, ec.ECDSA(hashes.SHA256()))


def signature_valid(key: ec.EllipticCurvePublicKey, signature: bytes, payload: bytes) -> bool:
    try:
        key.verify(signature, payload, ec.ECDSA(hashes.SHA256()))
    except (InvalidSignature, ValueError):
        return False
    return True


@dataclass(frozen=True)
class KeyPairFiles:
    private: Path
    public: Path


def write_key_pair(prefix: Path, password: bytes) -> KeyPairFiles:
    """PREFIX.key (0600) and PREFIX.pub, as `cosign generate-key-pair --output-key-prefix`; never over a
    file that is there."""
    from modelrunner.fileio import write_file_atomic

    files = KeyPairFiles(prefix.with_name(prefix.name + ".key"), prefix.with_name(prefix.name + ".pub"))
    for path in (files.private, files.public):
        if path.exists():
            raise InvalidKey(f"{path.name} exists already; remove it or choose another prefix")
    key = ec.generate_private_key(ec.SECP256R1())
    write_file_atomic(files.private, encrypt_private_key(key, password), mode=0o600)
    write_file_atomic(files.public, public_pem(key.public_key()))
    return files


def read_key_file(path: Path) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read(MAX_KEY_FILE_BYTES + 1)
    except OSError as exc:
        raise InvalidKey(f"cannot read the key file {path.name}: {exc.strerror}") from None
