"""The certificate of DMR's HTTPS listener when none is given (`pkg/tls/certs.go`): a self-signed CA and a
server certificate it signs, for localhost, docker-model-runner, 127.0.0.1 and ::1, ECDSA P-256, kept in
`<runner home>/certs/` (keys 0600) and made again when missing or within 30 days of expiry. Clients trust
`ca.crt` (MODEL_RUNNER_TLS_CA_CERT; our CLI picks it up by itself on this machine)."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

from modelrunner.errors import ModelRunnerError
from modelrunner.fileio import write_file_atomic

CA_DAYS, SERVER_DAYS, RENEW_DAYS = 3650, 365, 30


def certificate_paths(folder: Path) -> dict[str, Path]:
    return {name: folder / name for name in ("ca.crt", "ca.key", "server.crt", "server.key")}


def ensure_certificates(folder: Path) -> tuple[Path, Path]:
    """(server certificate, server key) in `folder`, made first when missing or about to expire."""
    paths = certificate_paths(folder)
    if not _still_valid(paths):
        _generate(paths)
    return paths["server.crt"], paths["server.key"]


def _still_valid(paths: dict[str, Path]) -> bool:
    from cryptography import x509

    if not all(path.is_file() for path in paths.values()):
        return False
    try:
        cert = x509.load_pem_x509_certificate(paths["server.crt"].read_bytes())
    except (OSError, ValueError):
        return False
    left = cert.not_valid_after_utc - datetime.datetime.now(datetime.UTC)
    return left > datetime.timedelta(days=RENEW_DAYS)


def _generate(paths: dict[str, Path]) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    def name(unit: str) -> x509.Name:
        return x509.Name(
            [
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, "modelrunner"),
                x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, unit),
                x509.NameAttribute(NameOID.COMMON_NAME, f"modelrunner {unit}"),
            ]
        )

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = name("Self-Signed CA")
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    server_key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = [x509.DNSName("localhost"), x509.DNSName("docker-model-runner")]
    names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ("127.0.0.1", "::1")]
    server_cert = (
        x509.CertificateBuilder()
        .subject_name(name("Server"))
        .issuer_name(ca_name)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=SERVER_DAYS))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    def key_bytes(key: ec.EllipticCurvePrivateKey) -> bytes:
        return key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )

    try:
        paths["ca.crt"].parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_file_atomic(paths["ca.key"], key_bytes(ca_key), mode=0o600)
        write_file_atomic(paths["ca.crt"], ca_cert.public_bytes(serialization.Encoding.PEM))
        write_file_atomic(paths["server.key"], key_bytes(server_key), mode=0o600)
        write_file_atomic(paths["server.crt"], server_cert.public_bytes(serialization.Encoding.PEM))
    except OSError as exc:
        raise ModelRunnerError(f"cannot write the TLS certificates: {exc.strerror or exc}") from None
