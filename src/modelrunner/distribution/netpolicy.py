"""Where the registry client may connect: plain HTTP rules and the private-address guard for redirects.

A registry may send us elsewhere (blob storage redirects, token realms). Following that blindly lets a
hostile registry make the daemon reach services on this machine or its network (CVE-2026-5530), so a target
may be loopback, link-local or private only if the registry itself is in that same class.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from enum import Enum
from urllib.parse import urlsplit

from modelrunner.distribution.errors import UnsafeRedirect


class AddressClass(Enum):
    PUBLIC = "public"
    LOOPBACK = "loopback"
    LINK_LOCAL = "link-local"
    PRIVATE = "private"


def host_of_registry(registry: str) -> str:
    """`host[:port]` (IPv6 in brackets) -> host."""
    if registry.startswith("["):
        return registry[1 : registry.index("]")]
    return registry.rsplit(":", 1)[0] if registry.count(":") == 1 else registry


def classify_ip(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> AddressClass:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_loopback:
        return AddressClass.LOOPBACK
    if ip.is_link_local:
        return AddressClass.LINK_LOCAL
    if ip.is_private or ip.is_reserved or ip.is_unspecified or ip.is_multicast:
        return AddressClass.PRIVATE
    return AddressClass.PUBLIC


def classify_host(host: str) -> set[AddressClass]:
    """Classes of every address the host resolves to (a name may resolve to several)."""
    try:
        return {classify_ip(ipaddress.ip_address(host))}
    except ValueError:
        pass
    if host == "localhost":
        return {AddressClass.LOOPBACK}
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError:
        return {AddressClass.PUBLIC}  # unresolvable: the connection itself will fail
    return {classify_ip(ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])) for info in infos}


def is_loopback(host: str) -> bool:
    return classify_host(host) == {AddressClass.LOOPBACK}


def insecure_allowed(registry: str) -> bool:
    """Plain HTTP only for loopback registries and hosts named in INSECURE_REGISTRY (`true` = all, as DMR)."""
    setting = os.environ.get("INSECURE_REGISTRY", "").strip()
    if setting.lower() == "true":
        return True
    named = {item.strip().lower() for item in setting.split(",") if item.strip()}
    host = host_of_registry(registry)
    if registry in named or host in named:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def check_target(url: str, registry: str, what: str) -> None:
    """Refuse a redirect or realm URL that leaves the registry's address class or downgrades to HTTP."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UnsafeRedirect(f"refusing {what} to a non-HTTP URL")
    if parts.scheme == "http" and not insecure_allowed(registry) and not insecure_allowed(parts.netloc):
        raise UnsafeRedirect(f"refusing {what} from HTTPS to plain HTTP ({parts.hostname})")
    allowed = classify_host(host_of_registry(registry)) | {AddressClass.PUBLIC}
    target = classify_host(parts.hostname)
    refused = target - allowed
    if refused:
        kinds = ", ".join(sorted(c.value for c in refused))
        raise UnsafeRedirect(f"refusing {what} to a {kinds} address ({parts.hostname})")
