"""Node ids from Kubernetes node names. Pure.

rlslice ids are DNS-1123 labels (at most 63 characters, no dots), but Kubernetes node names
are DNS-1123 *subdomains*: `ip-10-0-1-7.ec2.internal` or `gpu-a.rack3.example.com` are
common. `node_label(name)` maps a node name to the id the agent registers under and the
scheduler matches groups against:

- a name that is already a label is kept as it is (`gpu-1` -> `gpu-1`);
- any other name keeps its readable part (lower case, runs of other characters become
  one `-`, cut so the whole fits in 63 characters) and gets `-` plus the first 8 hex
  digits of the SHA-256 of the full name, so two names that read alike never collide
  (`ip-10-0-1-7.ec2.internal` -> `ip-10-0-1-7-ec2-internal-27992f17`).

The mapping is deterministic: the agent and the scheduler compute the same id without
talking. Two names map to one id only when their readable parts agree and their hashes
share 8 hex digits (about 1 in 4 billion).
"""

from __future__ import annotations

import hashlib
import re

from rlslice._ids import MAX_ID_LENGTH, is_valid_id

HASH_DIGITS = 8
_OTHER = re.compile(r"[^a-z0-9]+")


def node_label(name: str) -> str:
    """The node id (a DNS-1123 label) for the Kubernetes node `name`.

    >>> node_label("gpu-1")
    'gpu-1'
    >>> node_label("ip-10-0-1-7.ec2.internal")[:-9]
    'ip-10-0-1-7-ec2-internal'
    """
    if is_valid_id(name):
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:HASH_DIGITS]
    readable = _OTHER.sub("-", name.lower()).strip("-")
    readable = readable[: MAX_ID_LENGTH - HASH_DIGITS - 1].rstrip("-")
    return f"{readable}-{digest}" if readable else f"node-{digest}"
