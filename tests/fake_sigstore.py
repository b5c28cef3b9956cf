"""A Sigstore of the test's own, in-process and offline, for keyless verification (signing/keyless.py).

Its parts are what a verifier checks a cosign v3 bundle against, each with a key of its own:
* a Fulcio CA: a root certificate that issues a short-lived leaf to an identity (the SAN) with the OIDC
  issuer extension, code signing EKU and an embedded SCT;
* a CT log whose key signs that SCT (RFC 6962, over the precertificate: the leaf's TBS without the SCT);
* a Rekor log whose key signs the entry's inclusion promise (SET) and the checkpoint of a two-leaf Merkle
  tree holding the entry (RFC 6962 hashes, the proof one hash long).
`trusted_root()` is the trusted_root.json naming them; `bundle(...)` signs an in-toto statement in a DSSE
envelope with a fresh leaf and records it as Rekor v1's `dsse` 0.0.1 entry, as `cosign sign` does.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import json
import struct
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

BUNDLE_MEDIA_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json"
IN_TOTO = "application/vnd.in-toto+json"
OIDC_ISSUER_OID = x509.ObjectIdentifier("1.3.6.1.4.1.57264.1.1")  # Fulcio's issuer extension (v1: raw)
SCT_LIST_OID = x509.ObjectIdentifier("1.3.6.1.4.1.11129.2.4.2")
TRUSTED_ROOT_MEDIA_TYPE = "application/vnd.dev.sigstore.trustedroot+json;version=0.1"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _spki(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def _key_id(key: ec.EllipticCurvePrivateKey) -> bytes:
    return hashlib.sha256(_spki(key)).digest()


def _sign(key: ec.EllipticCurvePrivateKey, data: bytes) -> bytes:
    return key.sign(data, ec.ECDSA(hashes.SHA256()))


def _der_octet_string(data: bytes) -> bytes:
    length = len(data)
    if length < 0x80:
        return b"\x04" + bytes([length]) + data
    encoded = length.to_bytes((length.bit_length() + 7) // 8, "big")
    return b"\x04" + bytes([0x80 | len(encoded)]) + encoded + data


def _leaf_hash(data: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + data).digest()


def _node_hash(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE's pre-authentication encoding: what the envelope's signature is over."""
    kind = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)


def statement(name: str, digest: str) -> bytes:
    """cosign v3's signing statement for an OCI manifest: in-toto v1, the manifest as its subject."""
    algorithm, _, value = digest.partition(":")
    document = {
        "_type": "https://in-toto.io/Statement/v1",
        "subject": [{"name": name, "digest": {algorithm: value}}],
        "predicateType": "https://sigstore.dev/cosign/sign/v1",
        "predicate": {},
    }
    return json.dumps(document).encode()


class FakeSigstore:
    def __init__(self) -> None:
        self.now = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
        self.ca_key = ec.generate_private_key(ec.SECP256R1())
        self.ct_key = ec.generate_private_key(ec.SECP256R1())
        self.rekor_key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "test sigstore")])
        public = self.ca_key.public_key()
        self.ca_cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(public)
            .serial_number(x509.random_serial_number())
            .not_valid_before(self.now - datetime.timedelta(days=1))
            .not_valid_after(self.now + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=1), critical=True)
            .add_extension(_key_usage(cert_sign=True), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
            .sign(self.ca_key, hashes.SHA256())
        )

    def trusted_root(self) -> dict[str, Any]:
        """trusted_root.json for this Sigstore (the protobuf-specs' TrustedRoot, as cosign and
        sigstore-python read it)."""
        start = {"start": (self.now - datetime.timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%SZ")}

        def log(key: ec.EllipticCurvePrivateKey, url: str) -> dict[str, Any]:
            return {
                "baseUrl": url,
                "hashAlgorithm": "SHA2_256",
                "publicKey": {
                    "rawBytes": _b64(_spki(key)),
                    "keyDetails": "PKIX_ECDSA_P256_SHA_256",
                    "validFor": start,
                },
                "logId": {"keyId": _b64(_key_id(key))},
            }

        return {
            "mediaType": TRUSTED_ROOT_MEDIA_TYPE,
            "tlogs": [log(self.rekor_key, "https://rekor.invalid")],
            "certificateAuthorities": [
                {
                    "subject": {"organization": "test sigstore", "commonName": "test sigstore"},
                    "uri": "https://fulcio.invalid",
                    "certChain": {
                        "certificates": [
                            {"rawBytes": _b64(self.ca_cert.public_bytes(serialization.Encoding.DER))}
                        ]
                    },
                    "validFor": start,
                }
            ],
            "ctlogs": [log(self.ct_key, "https://ctfe.invalid")],
            "timestampAuthorities": [],
        }

    def leaf(self, key: ec.EllipticCurvePrivateKey, identity: str, issuer: str) -> x509.Certificate:
        """A Fulcio certificate for `identity`, valid ten minutes, with its SCT embedded."""
        public = key.public_key()
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([]))
            .issuer_name(self.ca_cert.subject)
            .public_key(public)
            .serial_number(x509.random_serial_number())
            .not_valid_before(self.now - datetime.timedelta(minutes=1))
            .not_valid_after(self.now + datetime.timedelta(minutes=9))
            .add_extension(_key_usage(digital_signature=True), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CODE_SIGNING]), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.ca_key.public_key()), critical=False
            )
            .add_extension(_san(identity), critical=True)
            .add_extension(x509.UnrecognizedExtension(OIDC_ISSUER_OID, issuer.encode()), critical=False)
        )
        # The SCT is over the certificate without it: the same builder, signed once without, once with.
        precertificate = builder.sign(self.ca_key, hashes.SHA256())
        sct = self._sct(precertificate.tbs_certificate_bytes)
        sct_list = struct.pack("!H", len(sct) + 2) + struct.pack("!H", len(sct)) + sct
        extension = x509.UnrecognizedExtension(SCT_LIST_OID, _der_octet_string(sct_list))
        return builder.add_extension(extension, critical=False).sign(self.ca_key, hashes.SHA256())

    def _sct(self, tbs: bytes) -> bytes:
        timestamp = int(self.now.timestamp() * 1000)
        issuer_key_hash = _key_id(self.ca_key)
        entry = issuer_key_hash + len(tbs).to_bytes(3, "big") + tbs
        signed = struct.pack("!BBQH", 0, 0, timestamp, 1) + entry + struct.pack("!H", 0)
        signature = _sign(self.ct_key, signed)
        return (
            struct.pack("!B", 0)
            + _key_id(self.ct_key)
            + struct.pack("!QH", timestamp, 0)
            + struct.pack("!BBH", 4, 3, len(signature))  # sha256, ecdsa
            + signature
        )

    def bundle(self, payload: bytes, identity: str, issuer: str) -> dict[str, Any]:
        """A Sigstore bundle v0.3 of `payload` (an in-toto statement) signed keylessly by `identity`."""
        key = ec.generate_private_key(ec.SECP256R1())
        certificate = self.leaf(key, identity, issuer)
        signature = _sign(key, pae(IN_TOTO, payload))
        pem = certificate.public_bytes(serialization.Encoding.PEM)
        body = json.dumps(
            {
                "apiVersion": "0.0.1",
                "kind": "dsse",
                "spec": {
                    "envelopeHash": {"algorithm": "sha256", "value": hashlib.sha256(payload).hexdigest()},
                    "payloadHash": {"algorithm": "sha256", "value": hashlib.sha256(payload).hexdigest()},
                    "signatures": [{"signature": _b64(signature), "verifier": _b64(pem)}],
                },
            }
        ).encode()
        return {
            "mediaType": BUNDLE_MEDIA_TYPE,
            "verificationMaterial": {
                "certificate": {"rawBytes": _b64(certificate.public_bytes(serialization.Encoding.DER))},
                "tlogEntries": [self._log_entry(body)],
            },
            "dsseEnvelope": {
                "payload": _b64(payload),
                "payloadType": IN_TOTO,
                "signatures": [{"sig": _b64(signature), "keyid": ""}],
            },
        }

    def _log_entry(self, body: bytes) -> dict[str, Any]:
        """The entry as the second leaf of a two-leaf log: inclusion proof, checkpoint, promise."""
        import rfc8785

        index, size, integrated = 1, 2, int(self.now.timestamp())
        other = _leaf_hash(b"an earlier entry")
        root = _node_hash(other, _leaf_hash(body))
        log_id = _key_id(self.rekor_key)
        note = f"rekor.invalid - 1\n{size}\n{_b64(root)}\n"
        signed_note = _b64(log_id[:4] + _sign(self.rekor_key, note.encode()))
        promise: dict[str, str | int] = {
            "body": _b64(body),
            "integratedTime": integrated,
            "logID": log_id.hex(),
            "logIndex": index,
        }
        return {
            "logIndex": str(index),
            "logId": {"keyId": _b64(log_id)},
            "kindVersion": {"kind": "dsse", "version": "0.0.1"},
            "integratedTime": str(integrated),
            "inclusionPromise": {"signedEntryTimestamp": _b64(_sign(self.rekor_key, rfc8785.dumps(promise)))},
            "inclusionProof": {
                "logIndex": str(index),
                "rootHash": _b64(root),
                "treeSize": str(size),
                "hashes": [_b64(other)],
                "checkpoint": {"envelope": f"{note}\n\u2014 rekor.invalid {signed_note}\n"},
            },
            "canonicalizedBody": _b64(body),
        }


def _key_usage(*, cert_sign: bool = False, digital_signature: bool = False) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=digital_signature,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _san(identity: str) -> x509.SubjectAlternativeName:
    if "@" in identity and "://" not in identity:
        return x509.SubjectAlternativeName([x509.RFC822Name(identity)])
    return x509.SubjectAlternativeName([x509.UniformResourceIdentifier(identity)])
