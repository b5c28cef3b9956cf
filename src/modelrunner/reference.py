"""Model references: parsing and normalisation the way Docker Model Runner does it.

DMR (`distribution/client.go: normalizeModelName`, then `oci/reference.ParseReference` over
distribution/reference) trims the input, rewrites `hf.co/` to `huggingface.co/`, adds `ai/` to a bare name
(also to a one-component Docker Hub name: `docker.io/x` is `docker.io/ai/x`) and `:latest` when there is
neither tag nor digest (an empty tag, `x:`, is `:latest` too), and lowercases the name but never the tag:
Hugging Face tags keep their case (`huggingface.co/org/repo:Q4_K_M`). Docker Hub is `docker.io` (what
`index.docker.io` also means), so `str(reference)` is the tag DMR stores: `docker.io/ai/x:latest`.
On top of that the Docker reference grammar is applied strictly: references become store keys, bundle
paths and registry URLs, so anything path-like, encoded or non-ASCII is refused rather than cleaned.

Model IDs (`sha256:<hex>`, bare 12 or 64 hex) are not references; callers try `parse_model_id` first, as
DMR does.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field

from modelrunner import config
from modelrunner.digest import digest_problem, validate_digest
from modelrunner.errors import InvalidReference, quote_input

MAX_INPUT_LENGTH = 4096  # refused before any parsing, so the work done on hostile input stays bounded
MAX_NAME_LENGTH = 255  # Docker's limit on `registry/repository`
MAX_TAG_LENGTH = 128
DEFAULT_NAMESPACE = "ai"
DEFAULT_TAG = "latest"
DOCKER_HUB = "docker.io"  # how DMR's store writes Docker Hub (distribution/reference's canonical domain)
HUGGING_FACE = "huggingface.co"

# distribution/reference maps `index.docker.io` to `docker.io`; DMR maps `hf.co` to `huggingface.co`.
_REGISTRY_ALIASES = {"index.docker.io": DOCKER_HUB, "hf.co": HUGGING_FACE}

# Patterns as strings, matched through re's own cache: each is compiled when first used, not by every
# process that imports this module (a CLI verb may need one pattern, or none).
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]*"
_HEX12 = r"[0-9a-f]{12}"
_HEX64 = r"[0-9a-f]{64}"
_HOST_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
_IPV6_CHARS = r"[0-9a-f:.]+"
_PORT = r"[0-9]{1,5}"


@dataclass(frozen=True)
class Reference:
    """A normalised model reference. Equality and hashing ignore the `original_*` fields: two spellings
    that normalise alike name the same stored model."""

    registry: str
    repository: str
    tag: str | None
    digest: str | None
    # As the user typed it (ai/ prefix included): the Hugging Face API is case-sensitive. Tags are
    # never lowercased, so `tag` is already as typed.
    original_repository: str = field(compare=False)

    def __str__(self) -> str:
        text = self.name
        if self.tag is not None:
            text += f":{self.tag}"
        if self.digest is not None:
            text += f"@{self.digest}"
        return text

    @property
    def name(self) -> str:
        return f"{self.registry}/{self.repository}"

    @property
    def is_huggingface(self) -> bool:
        return self.registry == HUGGING_FACE


def parse_reference(text: str, default_registry: str | None = None) -> Reference:
    """Parse and normalise a model reference; raises InvalidReference."""
    if len(text) > MAX_INPUT_LENGTH:
        raise _invalid(text, f"longer than {MAX_INPUT_LENGTH} characters")
    ref = text.strip()
    if not ref:
        raise InvalidReference("model reference is empty; give a name such as ai/smollm2")
    _check_characters(ref)
    if ref.startswith("/"):
        raise _invalid(ref, "absolute paths are not model references")
    if ref.lower().startswith("sha256:"):
        raise _invalid(ref, "this is a model ID or digest, not a name; use name@sha256:<hex> for a digest")

    name, digest = _split_digest(ref)
    name, tag = _split_tag(ref, name)
    if not name:
        raise _invalid(ref, "missing model name")
    parts = name.split("/")
    if any(part in (".", "..") for part in parts):
        raise _invalid(ref, "'.' and '..' path components are not allowed")
    if "" in parts:
        raise _invalid(ref, "empty path component (check for '//' or a trailing '/')")

    # Docker's rule: a first component with '.' or ':' (or `localhost`) is a registry host, given a '/'.
    explicit_registry = len(parts) > 1 and (
        "." in parts[0] or ":" in parts[0] or parts[0].lower() == "localhost"
    )
    if explicit_registry:
        try:
            registry = _normalise_registry(parts.pop(0))
        except ValueError as exc:
            raise _invalid(ref, str(exc)) from None
    else:
        registry = _default_registry(default_registry)
        if len(parts) == 1 and re.fullmatch(_HEX64, parts[0].lower()):
            raise _invalid(ref, "a 64-character hex string is a model ID, not a name")
    if len(parts) == 1 and (registry == DOCKER_HUB or not explicit_registry):
        # distribution/reference gives a one-component Hub name `library/`, which DMR replaces with `ai/`.
        parts.insert(0, DEFAULT_NAMESPACE)

    original_repository = "/".join(parts)
    repository = original_repository.lower()
    for component in repository.split("/"):
        if not re.fullmatch(_COMPONENT, component):
            raise _invalid(
                ref,
                f"invalid path component {quote_input(component)}: use letters, digits and single . _ or - "
                "between them",
            )
    if len(registry) + 1 + len(repository) > MAX_NAME_LENGTH:
        raise _invalid(ref, f"name is longer than {MAX_NAME_LENGTH} characters")

    if tag is None and digest is None:
        tag = DEFAULT_TAG
    return Reference(registry, repository, tag, digest, original_repository)


def parse_model_id(text: str) -> str | None:
    """`sha256:<64 hex>`, bare 64 hex or a 12-hex short ID as `sha256:<hex>`; None for anything else.

    Only lowercase hex is an ID. A `sha256:` prefix followed by neither 12 nor 64 lowercase hex is a broken
    ID, not a name, so it raises InvalidDigest.
    """
    value = text.strip()
    if value.startswith("sha256:") and re.fullmatch(_HEX12, value[len("sha256:") :]):
        return value  # a short-ID prefix written with its algorithm
    if value.lower().startswith("sha256:"):
        return validate_digest(value)
    if re.fullmatch(_HEX64, value) or re.fullmatch(_HEX12, value):
        return f"sha256:{value}"
    return None


def same_reference(a: str, b: str) -> bool:
    """Whether two references name the same model once normalised; an unparseable one matches nothing."""
    try:
        return parse_reference(a) == parse_reference(b)
    except InvalidReference:
        return False


def _invalid(text: str, problem: str) -> InvalidReference:
    return InvalidReference(f"invalid model reference {quote_input(text)}: {problem}")


def _check_characters(ref: str) -> None:
    for char in ref:
        code = ord(char)
        if code < 0x20 or 0x7F <= code <= 0x9F:
            raise _invalid(ref, "contains a control character")
        if char.isspace():
            raise _invalid(ref, "contains whitespace")
        if code > 0x7E:
            # Also stops case-folding tricks: "\u212a".lower() is an ASCII "k".
            raise _invalid(ref, "only ASCII characters are allowed")
        if char == "%":
            raise _invalid(ref, "percent-encoding is not allowed; write the name in plain text")
        if char == "\\":
            raise _invalid(ref, "backslashes are not allowed; use '/' between path components")


def _split_digest(ref: str) -> tuple[str, str | None]:
    name, at, digest = ref.partition("@")
    if not at:
        return ref, None
    if not digest:
        raise _invalid(ref, "ends with '@' but no digest follows")
    if "@" in digest:
        raise _invalid(ref, "more than one '@'")
    problem = digest_problem(digest)
    if problem is not None:
        raise _invalid(ref, f"bad digest: {problem}")
    return name, digest


def _split_tag(ref: str, name: str) -> tuple[str, str | None]:
    colon = name.rfind(":")
    if colon <= name.rfind("/"):
        return name, None  # no colon, or it belongs to a registry port
    tag = name[colon + 1 :]
    if not tag:
        return name[:colon], None  # `model:` is `model:latest` in DMR (normalizeModelName)
    if len(tag) > MAX_TAG_LENGTH:
        raise _invalid(ref, f"tag is longer than {MAX_TAG_LENGTH} characters")
    if not re.fullmatch(_TAG, tag):
        raise _invalid(
            ref, f"invalid tag {quote_input(tag)}: use letters, digits, _ . - and do not start with . or -"
        )
    return name[:colon], tag


def _default_registry(explicit: str | None) -> str:
    raw = explicit or config.default_registry()
    try:
        return _normalise_registry(raw)
    except ValueError as exc:
        shown = quote_input(raw)
        raise InvalidReference(f"default registry {shown} is not a valid registry host: {exc}") from None


def _normalise_registry(raw: str) -> str:
    """Lowercased `host[:port]`, with aliases resolved; raises ValueError naming the problem."""
    host = raw.lower()
    port: str | None = None
    if host.startswith("["):
        end = host.find("]")
        if end < 0:
            raise ValueError("IPv6 registry address is missing its ']'")
        address, rest = host[1:end], host[end + 1 :]
        if not re.fullmatch(_IPV6_CHARS, address):
            raise ValueError(f"invalid IPv6 address {quote_input(address)}")
        try:
            host = f"[{ipaddress.IPv6Address(address).compressed}]"
        except ValueError:
            raise ValueError(f"invalid IPv6 address {quote_input(address)}") from None
        if rest:
            if not rest.startswith(":"):
                raise ValueError("expected ':port' after the IPv6 address")
            port = rest[1:]
    else:
        host, colon, port_text = host.partition(":")
        port = port_text if colon else None
        _check_hostname(host)
    if port is None:
        return _REGISTRY_ALIASES.get(host, host)
    if not re.fullmatch(_PORT, port) or not 1 <= int(port) <= 65535:
        raise ValueError(f"registry port {quote_input(port)} must be a number from 1 to 65535")
    return f"{host}:{int(port)}"


def _check_hostname(host: str) -> None:
    labels = host.split(".")
    if not all(re.fullmatch(_HOST_LABEL, label) for label in labels):
        raise ValueError(f"invalid registry host {quote_input(host)}")
    if all(label.isdigit() for label in labels):
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            raise ValueError(f"invalid IPv4 registry address {quote_input(host)}") from None
