"""Address helpers shared by the servers: which host a `host:port` names, and whether only
this machine can reach it (the servers refuse to listen beyond it unauthenticated)."""

from __future__ import annotations

import ipaddress


def host_of(address: str) -> str:
    """The host part of `host:port` (brackets of an IPv6 literal removed)."""
    host = address.rpartition(":")[0]
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def is_loopback(host: str) -> bool:
    """True for localhost and loopback addresses; False for 0.0.0.0, :: and other names."""
    if host in ("localhost", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
