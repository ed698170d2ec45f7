"""Custody fingerprints of the three keys (CONTRACT §7.4).

A fingerprint identifies a key without revealing it: the hex HMAC-SHA-256 of a fixed label
under the key. The database keeps the fingerprint of each state key version and of the
admission key from the first apply that saw them; startup and ``deployment-status`` compare
the configured key files with those records, so a swapped or lost key file is found before
anything is written with it. ``coordinatorctl keys fingerprint`` prints the same values for
an operator to compare with the key custody records kept outside the database.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import Any

from core.config.model import RuntimeConfig
from core.secrets import SecretResolver

CUSTODY_LABEL = b"registry-coordinator custody v1"


def fingerprint(key: bytes) -> str:
    """The custody fingerprint of ``key``: hex HMAC-SHA-256(key, custody label)."""
    return hmac.new(key, CUSTODY_LABEL, hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class KeyFingerprints:
    """The fingerprint of every configured key; never the keys themselves."""

    state_keys: tuple[tuple[int, str], ...]
    """(version, fingerprint) of each state key version, ascending by version."""
    admission_key: str
    """Fingerprint of the admission key."""
    audit_key: str
    """Fingerprint of the audit key."""

    def to_json(self) -> dict[str, Any]:
        """The ``keys fingerprint --output json`` document."""
        return {
            "stateKeys": [
                {"version": version, "fingerprint": value} for version, value in self.state_keys
            ],
            "admissionKey": self.admission_key,
            "auditKey": self.audit_key,
        }


def resolver_for(config: RuntimeConfig) -> SecretResolver:
    """The secret resolver of a runtime file's ``secretProviders`` block."""
    providers = config.secret_providers
    root = providers.file.root if providers.file is not None else None
    return SecretResolver(file_root=root, environment=providers.environment)


def state_key_fingerprints(
    config: RuntimeConfig, resolver: SecretResolver | None = None
) -> tuple[tuple[int, str], ...]:
    """(version, fingerprint) of every configured state key version, ascending by version."""
    reader = resolver or resolver_for(config)
    versions = sorted(config.deployment.state_keys, key=lambda state_key: state_key.version)
    return tuple((item.version, fingerprint(reader.read_key(item.ref))) for item in versions)


def admission_key_fingerprint(config: RuntimeConfig, resolver: SecretResolver | None = None) -> str:
    """Fingerprint of the configured admission key."""
    reader = resolver or resolver_for(config)
    return fingerprint(reader.read_key(config.deployment.admission_key_ref))


def fingerprints(config: RuntimeConfig, resolver: SecretResolver | None = None) -> KeyFingerprints:
    """Read the three keys of ``config`` and fingerprint each; a bad key file refuses.

    Refusals are the resolver's (``secret.unreadable``, ``secret.insecure``,
    ``secret.malformed``) and name the reference, never the content.
    """
    reader = resolver or resolver_for(config)
    return KeyFingerprints(
        state_keys=state_key_fingerprints(config, reader),
        admission_key=admission_key_fingerprint(config, reader),
        audit_key=fingerprint(reader.read_key(config.deployment.audit_key_ref)),
    )
