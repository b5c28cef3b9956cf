"""`model trust keygen`, `model sign` and `model verify`: cosign-compatible keys and signatures.

These run in the CLI's own process, not the daemon's: the private key and its password never leave the
user's process (as with cosign), and a signature is written to the registry with the user's own Docker
credentials. Key files are cosign's (`model trust keygen` writes what `cosign generate-key-pair` does).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from modelrunner.cli.common import UsageError

VERIFY_FAILURE = "Verification failed"


def load_private_key(path: str) -> Any:
    from modelrunner.signing import keys

    return keys.decrypt_private_key(keys.read_key_file(Path(path)), keys.password_from_environment())


def load_public_keys(paths: list[str]) -> list[Any]:
    from modelrunner.signing import keys

    return [keys.load_public_key(keys.read_key_file(Path(path))) for path in paths]


def sign_in_registry(reference_text: str, private_key: Any, expected_digest: str | None = None) -> None:
    from modelrunner.reference import parse_reference
    from modelrunner.signing.registry import sign_reference

    signed = sign_reference(parse_reference(reference_text), private_key, expected_digest)
    print(f"Signed {signed.docker_reference}@{signed.digest} with key {signed.signer}")


def cmd_keygen(args: argparse.Namespace) -> int:
    from modelrunner.signing import keys

    files = keys.write_key_pair(Path(args.prefix), keys.password_from_environment())
    print(f"Private key written to {files.private}")
    print(f"Public key written to {files.public}")
    return 0


def cmd_sign(args: argparse.Namespace) -> int:
    sign_in_registry(args.model, load_private_key(args.key))
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from modelrunner.errors import ModelRunnerError

    try:
        if args.certificate_identity or args.certificate_oidc_issuer:
            return _verify_keyless(args)
        if not args.key:
            raise UsageError("--key, or --certificate-identity and --certificate-oidc-issuer, is needed")
        public_keys = load_public_keys(args.key)
        if args.local or args.deep:
            return _verify_in_store(args)
        from modelrunner.reference import parse_reference
        from modelrunner.signing.registry import verify_reference

        verified = verify_reference(parse_reference(args.model), public_keys)
    except ModelRunnerError as exc:
        print(f"{VERIFY_FAILURE}: {exc.message}", file=sys.stderr)
        return 1
    print(f"Verified {args.model}@{verified.digest}")
    print(f"Signed by {verified.signer} for {verified.docker_reference}")
    return 0


def _verify_keyless(args: argparse.Namespace) -> int:
    """A Sigstore bundle beside the model in its registry, against the identity and the trusted root."""
    from modelrunner.reference import parse_reference
    from modelrunner.signing import keyless

    if not (args.certificate_identity and args.certificate_oidc_issuer):
        raise UsageError("--certificate-identity and --certificate-oidc-issuer go together")
    if args.key or args.local or args.deep:
        raise UsageError("keyless verification reads the registry: no --key, --local or --deep")
    root_text = keyless.read_trusted_root(Path(args.trusted_root)) if args.trusted_root else None
    identity = keyless.Identity(args.certificate_identity, args.certificate_oidc_issuer)
    reference = parse_reference(args.model)
    verified = keyless.verify_reference_keyless(reference, [identity], keyless.load_trusted_root(root_text))
    print(f"Verified {args.model}@{verified.digest}")
    print(f"Signed by {verified.signer} for {verified.docker_reference}")
    return 0


def _verify_in_store(args: argparse.Namespace) -> int:
    """The store is the daemon's: it checks the signature its pull kept (and with --deep the blobs), with
    the public keys the user names here, sent as text."""
    from modelrunner.cli.common import client
    from modelrunner.signing import keys

    pems = [keys.read_key_file(Path(path)).decode("ascii", "replace") for path in args.key]
    answer = client().verify_model(args.model, pems, args.deep)
    checked = "signature and blob hashes" if args.deep else "signature"
    print(f"Verified {args.model}@{answer['id']} in the store ({checked})")
    when = answer["verification"]["verifiedAt"]
    print(f"Signed by {answer['signer']} for {answer['dockerReference']}, verified at pull {when}")
    return 0


def _policy_file() -> Path:
    from modelrunner import config
    from modelrunner.signing.policy import policy_path

    return policy_path(config.runner_home())


def cmd_trust_set(args: argparse.Namespace) -> int:
    from modelrunner.signing import keys
    from modelrunner.signing.policy import Rule, normalise_pattern, set_rule

    pems = []
    for path in args.key or []:
        pem = keys.read_key_file(Path(path))
        keys.load_public_key(pem)  # a key in a wrong format is refused before the policy changes
        pems.append(pem.decode("ascii").strip() + "\n")
    identities, root = _keyless_signer(args)
    if args.mode != "off" and not pems and not identities:
        raise UsageError("--key or --certificate-identity is needed unless --mode off")
    rule = Rule(normalise_pattern(args.pattern), tuple(pems), args.mode, identities, root)
    set_rule(_policy_file(), rule)
    print(f"Trust rule set: {rule.pattern} ({rule.mode}, {len(pems)} key(s), {len(identities)} identity)")
    return 0


def _keyless_signer(args: argparse.Namespace) -> tuple[tuple[tuple[str, str], ...], str | None]:
    """`trust set`'s keyless signer, its trusted root checked (and kept as text) before the policy changes."""
    if not args.certificate_identity and not args.certificate_oidc_issuer:
        if args.trusted_root:
            raise UsageError("--trusted-root goes with --certificate-identity")
        return (), None
    if not (args.certificate_identity and args.certificate_oidc_issuer):
        raise UsageError("--certificate-identity and --certificate-oidc-issuer go together")
    from modelrunner.signing import keyless

    root = keyless.read_trusted_root(Path(args.trusted_root)) if args.trusted_root else None
    return ((args.certificate_identity, args.certificate_oidc_issuer),), root


def cmd_trust_ls(args: argparse.Namespace) -> int:
    from modelrunner.signing import keys
    from modelrunner.signing.policy import load_rules

    rules = load_rules(_policy_file())
    if args.json:
        print(json.dumps([rule.to_json() for rule in rules], indent=2))
        return 0
    print(f"{'PATTERN':<40} {'MODE':<8} KEYS / IDENTITIES")
    for rule in rules:
        signers = [keys.key_id(k)[:19] for k in rule.public_keys()]
        signers += [f"{identity} ({issuer})" for identity, issuer in rule.identities]
        print(f"{rule.pattern:<40} {rule.mode:<8} {', '.join(signers) or '-'}")
    return 0


def cmd_trust_rm(args: argparse.Namespace) -> int:
    from modelrunner.signing.policy import remove_rule

    remove_rule(_policy_file(), args.pattern)
    print(f"Trust rule removed: {args.pattern}")
    return 0


def add_commands(commands: Any) -> None:
    trust = commands.add_parser("trust", help="Manage signing keys (cosign's formats).")
    verbs = trust.add_subparsers(title="trust commands", metavar="COMMAND")
    keygen = verbs.add_parser(
        "keygen",
        help="Write PREFIX.key (encrypted with COSIGN_PASSWORD) and PREFIX.pub, an ECDSA P-256 pair.",
    )
    keygen.add_argument("prefix", help="path prefix of the two files, e.g. ./cosign")
    keygen.set_defaults(handler=cmd_keygen)
    set_ = verbs.add_parser("set", help="Require signatures by these keys for models matching PATTERN.")
    set_.add_argument("pattern", help="a normalised reference, `*` for any characters: docker.io/myorg/*, *")
    set_.add_argument("--key", action="append", help="PEM public key (repeat for more)")
    set_.add_argument("--certificate-identity", help="keyless: a signer's identity (certificate SAN)")
    set_.add_argument("--certificate-oidc-issuer", help="keyless: the OIDC issuer of that identity")
    set_.add_argument("--trusted-root", help="keyless: trusted_root.json (default: Sigstore's public-good)")
    set_.add_argument("--mode", choices=("enforce", "warn", "off"), default="enforce")
    set_.set_defaults(handler=cmd_trust_set)
    ls = verbs.add_parser("ls", help="List the trust rules.")
    ls.add_argument("--json", action="store_true", help="the rules as JSON")
    ls.set_defaults(handler=cmd_trust_ls)
    rm = verbs.add_parser("rm", help="Remove the trust rule of PATTERN.")
    rm.add_argument("pattern")
    rm.set_defaults(handler=cmd_trust_rm)

    sign = commands.add_parser("sign", help="Sign a model in its registry (cosign's .sig tag).")
    sign.add_argument("model", help="the model's reference, e.g. registry.example/org/model:tag")
    sign.add_argument("--key", required=True, help="cosign private key file (password: COSIGN_PASSWORD)")
    sign.set_defaults(handler=cmd_sign)

    verify = commands.add_parser("verify", help="Verify a model's signature in its registry or the store.")
    verify.add_argument("model", help="the model's reference")
    verify.add_argument("--key", action="append", help="PEM public key (repeat for more)")
    verify.add_argument("--certificate-identity", help="keyless: the signer's identity (certificate SAN)")
    verify.add_argument("--certificate-oidc-issuer", help="keyless: the OIDC issuer of that identity")
    verify.add_argument(
        "--trusted-root", help="keyless: trusted_root.json of the Sigstore instance (default: public-good)"
    )
    verify.add_argument(
        "--local", action="store_true", help="the model in the store, offline, by the signature its pull kept"
    )
    verify.add_argument("--deep", action="store_true", help="--local, and hash every blob again")
    verify.set_defaults(handler=cmd_verify)
