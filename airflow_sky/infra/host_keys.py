"""Host keys as clouds publish them at boot, before anyone connects: what provisioning pins."""

from __future__ import annotations

import re
from collections.abc import Iterable

_HOST_KEYS_BLOCK = re.compile(r"-----BEGIN SSH HOST KEY KEYS-----(.*?)-----END SSH HOST KEY KEYS-----", re.S)
PREFERRED_KEY_TYPES = ("ssh-ed25519", "ecdsa-sha2-nistp256")


def host_key_from_console(console: str) -> str | None:
    """The host key cloud-init prints to the serial console (`<type> <base64>`), ed25519 first.

    cloud-init writes the block between fixed markers on first boot; each line is `<type> <base64> <comment>`.
    A key longer than a tag value allows (RSA) is not used: ed25519 and ECDSA fit.
    """
    match = _HOST_KEYS_BLOCK.search(console or "")
    if not match:
        return None
    lines = (line.split() for line in match.group(1).splitlines())
    return preferred_key((fields[0], fields[1]) for fields in lines if len(fields) >= 2)


def preferred_key(keys: Iterable[tuple[str, str]]) -> str | None:
    """`<type> <base64>` of the best of (type, base64) pairs: ed25519, then ECDSA (they fit a tag or label)."""
    found = {key_type: blob for key_type, blob in keys}
    return next((f"{t} {found[t]}" for t in PREFERRED_KEY_TYPES if t in found), None)
