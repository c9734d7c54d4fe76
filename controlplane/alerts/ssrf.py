"""SSRF guard for webhook targets.

A webhook URL is chosen by a user, and the control plane sits inside the fleet's private
network; without a guard, "send a test notification" would be a way to probe internal
services. Like Healthchecks, pdplane refuses targets that *resolve* to private, loopback,
link-local, multicast or reserved addresses unless the operator allows them with
``ALERTS_WEBHOOK_ALLOW`` (comma-separated CIDRs and/or host names).

The check runs after DNS resolution and returns the address to connect to; the transport
connects to exactly that address (see ``transport.py``), so a second, different DNS
answer (DNS rebinding) cannot slip past the check.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[[str, int], list[str]]


class UnsafeTarget(ValueError):
    """The URL is malformed, or resolves to an address pdplane may not call."""


@dataclass(frozen=True)
class AllowList:
    networks: tuple[IPNetwork, ...] = ()
    hosts: frozenset[str] = frozenset()

    def permits(self, host: str, address: IPAddress) -> bool:
        return host.lower().rstrip(".") in self.hosts or any(
            address in net for net in self.networks if net.version == address.version
        )


def parse_allow_list(items: Iterable[str]) -> AllowList:
    """CIDRs (``10.0.0.0/8``, ``127.0.0.1``) and host names. Raises ValueError on junk."""
    networks: list[IPNetwork] = []
    hosts: set[str] = set()
    for raw in items:
        item = raw.strip()
        if not item:
            continue
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
            continue
        except ValueError:
            pass
        name = item.lower().rstrip(".")
        if not name or any(c in name for c in "/:@ ") or name.startswith("-"):
            raise ValueError(f"{raw!r} is neither a CIDR nor a host name")
        hosts.add(name)
    return AllowList(tuple(networks), frozenset(hosts))


def system_resolver(host: str, port: int) -> list[str]:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise UnsafeTarget(f"cannot resolve {host!r}: {exc}") from None
    return [info[4][0] for info in infos]


# IPv6 prefixes that carry an IPv4 address in their low 32 bits and reach it through a
# translator (RFC 6052 NAT64, well-known and local-use prefixes).
_NAT64 = (ipaddress.IPv6Network("64:ff9b::/96"), ipaddress.IPv6Network("64:ff9b:1::/48"))


def embedded_ipv4(address: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address] | None:
    """The IPv4 address(es) an IPv6 address stands for, or None when it is plain IPv6.

    IPv4-mapped (``::ffff:a.b.c.d``), IPv4-compatible (``::a.b.c.d``), NAT64
    (``64:ff9b::/96``, ``64:ff9b:1::/48``), 6to4 (``2002::/16``) and Teredo (both the
    server and the de-obfuscated client). Each may lead to the IPv4 host, so each is judged
    as that host.
    """
    if address.ipv4_mapped is not None:
        return [address.ipv4_mapped]
    if address.sixtofour is not None:
        return [address.sixtofour]
    if address.teredo is not None:
        return list(address.teredo)
    value = int(address)
    if any(address in net for net in _NAT64):
        return [ipaddress.IPv4Address(value & 0xFFFFFFFF)]
    if value >> 32 == 0 and value > 1:  # IPv4-compatible (deprecated, still routable by some)
        return [ipaddress.IPv4Address(value)]
    return None


def is_public(address: IPAddress) -> bool:
    if isinstance(address, ipaddress.IPv6Address):
        embedded = embedded_ipv4(address)
        if embedded is not None:
            return all(is_public(inner) for inner in embedded)
    return address.is_global and not address.is_multicast


@dataclass(frozen=True)
class Target:
    scheme: str
    host: str
    port: int
    address: str  # the checked IP to connect to
    path: str  # path + query for the request line


LOCAL_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})


def _no_dns(host: str, port: int) -> list[str]:
    """For :func:`check_url_static`: literal addresses only, names pass unresolved."""
    try:
        return [str(ipaddress.ip_address(host))]
    except ValueError:
        if host.lower().rstrip(".") in LOCAL_NAMES or host.lower().endswith(".localhost"):
            return ["127.0.0.1"]
        return []


def check_url_static(url: str, allow: AllowList) -> None:
    """The checks that need no DNS (for forms and the API: fast, and no lookups of
    user-supplied names from a web request). Sending runs the full :func:`check_url`."""
    try:
        check_url(url, allow, _no_dns)
    except UnsafeTarget as exc:
        if "resolves to no address" not in str(exc):
            raise


def check_url(url: str, allow: AllowList, resolve: Resolver = system_resolver) -> Target:
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise UnsafeTarget(f"malformed URL: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise UnsafeTarget(f"scheme {parts.scheme!r} is not http or https")
    if not parts.hostname:
        raise UnsafeTarget("URL has no host")
    if parts.username or parts.password:
        raise UnsafeTarget("credentials in the URL are not allowed; use the signing secret")
    host = parts.hostname
    port = port or (443 if parts.scheme == "https" else 80)
    addresses = resolve(host, port)
    if not addresses:
        raise UnsafeTarget(f"{host!r} resolves to no address")
    checked: list[str] = []
    for text in addresses:
        address = ipaddress.ip_address(text.split("%", 1)[0])
        if not is_public(address) and not allow.permits(host, address):
            # One private answer is enough to refuse: the next resolution might pick it.
            raise UnsafeTarget(
                f"{host!r} resolves to {address}, a private/loopback/link-local address; "
                "allow it with ALERTS_WEBHOOK_ALLOW"
            )
        checked.append(str(address))
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return Target(parts.scheme, host, port, checked[0], path)
