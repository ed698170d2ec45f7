"""Payload sealing under the versioned state key (CONTRACT §7).

Every payload the coordinator stores (start inputs, step outputs, prepared commands, product
responses, wait results, event bodies) is sealed with AES-256-GCM before it reaches
PostgreSQL and opened where it is read. Each seal draws a fresh 96-bit nonce from the
operating system.

The associated data ties a ciphertext to the place it belongs: the deployment's namespace,
the run id, the payload's purpose and the key version. A row copied to another run, another
purpose or another deployment, or relabelled with another key version, fails to open. The
associated data is a length-prefixed encoding (see :func:`associated_data`), so no two
different field tuples can produce the same bytes.

Codes:

- ``command.state-key-custody`` (raw ``state-key-custody``): the sealed payload names a key
  version that is not configured.
- ``state.payload-unauthentic`` (internal): the ciphertext, nonce or associated data does not
  authenticate under the configured key. The detail never contains the payload.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from core.codes import Code
from core.errors import CoordinatorError

if TYPE_CHECKING:
    from core.config.model import RuntimeConfig
    from core.secrets import SecretResolver

KEY_BYTES: Final = 32
NONCE_BYTES: Final = 12
TAG_BYTES: Final = 16

PURPOSES: Final = ("input", "output", "command", "response", "wait-result", "event")
"""What a sealed payload is; part of the associated data."""

_AAD_LABEL: Final = b"registry-coordinator payload v1"


@dataclass(frozen=True, eq=False)
class Keyring:
    """The configured state key versions and the version new seals use.

    The keys are excluded from ``repr`` so a keyring in a log line or a traceback shows
    only its versions.
    """

    keys: Mapping[int, bytes] = field(repr=False)
    """Version → 32-byte AES key."""
    active: int
    """The version :func:`seal` uses."""

    def __post_init__(self) -> None:
        for version, key in self.keys.items():
            if isinstance(version, bool) or not isinstance(version, int) or version < 1:
                raise ValueError("state key versions are positive integers")
            if not isinstance(key, bytes) or len(key) != KEY_BYTES:
                raise ValueError(f"state key version {version} is not {KEY_BYTES} bytes")
        if self.active not in self.keys:
            raise ValueError(f"active state key version {self.active} is not configured")
        # Freeze a private copy so later changes to the caller's dict cannot reach us.
        object.__setattr__(self, "keys", MappingProxyType(dict(self.keys)))

    @property
    def versions(self) -> tuple[int, ...]:
        """Configured versions, ascending."""
        return tuple(sorted(self.keys))


@dataclass(frozen=True)
class Sealed:
    """A sealed payload as stored: key version, nonce, and ciphertext with its GCM tag."""

    key_version: int
    """The state key version it was sealed under."""
    nonce: bytes
    """12 random bytes."""
    ciphertext: bytes
    """AES-GCM output: the encrypted payload followed by the 16-byte tag."""


def associated_data(namespace: str, run_id: str, purpose: str, key_version: int) -> bytes:
    """The associated data of one payload.

    Layout: a fixed label, then each text field as a 4-byte big-endian length and its UTF-8
    bytes (namespace, run id, purpose), then the key version as a 4-byte big-endian
    unsigned integer. Length prefixes make the encoding injective.
    """
    if purpose not in PURPOSES:
        raise ValueError(f"unknown payload purpose {purpose!r}")
    if not 0 < key_version < 2**32:
        raise ValueError("state key version out of range")
    parts = [_AAD_LABEL]
    for text in (namespace, run_id, purpose):
        data = text.encode("utf-8")
        parts.append(struct.pack(">I", len(data)))
        parts.append(data)
    parts.append(struct.pack(">I", key_version))
    return b"".join(parts)


def seal(
    keyring: Keyring,
    namespace: str,
    run_id: str,
    purpose: str,
    plaintext: bytes,
    *,
    random_bytes: Callable[[int], bytes] = os.urandom,
) -> Sealed:
    """Encrypt ``plaintext`` under the active state key version.

    ``random_bytes`` exists for tests that need to observe the nonce source; production
    code keeps the default.
    """
    version = keyring.active
    nonce = random_bytes(NONCE_BYTES)
    if len(nonce) != NONCE_BYTES:
        raise ValueError("nonce source returned the wrong length")
    aad = associated_data(namespace, run_id, purpose, version)
    ciphertext = AESGCM(keyring.keys[version]).encrypt(nonce, plaintext, aad)
    return Sealed(key_version=version, nonce=nonce, ciphertext=ciphertext)


def open_(keyring: Keyring, namespace: str, run_id: str, purpose: str, sealed: Sealed) -> bytes:
    """Decrypt a sealed payload, checking that it belongs to this namespace, run and purpose.

    Raises ``command.state-key-custody`` when its key version is not configured and
    ``state.payload-unauthentic`` when it does not authenticate.
    """
    key = keyring.keys.get(sealed.key_version)
    if key is None:
        raise CoordinatorError(
            Code.STATE_KEY_CUSTODY,
            f"state key version {sealed.key_version} is not configured in deployment.stateKeys",
        )
    if len(sealed.nonce) != NONCE_BYTES or len(sealed.ciphertext) < TAG_BYTES:
        raise CoordinatorError(
            Code.STATE_PAYLOAD_UNAUTHENTIC, f"sealed {purpose} payload is malformed"
        )
    aad = associated_data(namespace, run_id, purpose, sealed.key_version)
    try:
        return AESGCM(key).decrypt(sealed.nonce, sealed.ciphertext, aad)
    except InvalidTag:
        raise CoordinatorError(
            Code.STATE_PAYLOAD_UNAUTHENTIC,
            f"sealed {purpose} payload does not authenticate under state key version "
            f"{sealed.key_version}",
        ) from None


def keyring_from_config(config: RuntimeConfig, resolver: SecretResolver) -> Keyring:
    """Read every configured state key version of ``config`` into a keyring.

    Key files are read through ``resolver`` (owner-only, exactly 32 bytes); its refusals
    name the reference, never the content.
    """
    deployment = config.deployment
    keys = {item.version: resolver.read_key(item.ref) for item in deployment.state_keys}
    return Keyring(keys=keys, active=deployment.active_state_key)
