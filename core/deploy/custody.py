"""Key custody: the configured keys against the fingerprints the database keeps (§7.4).

Three failures refuse with ``command.state-key-custody`` (the service prints the raw
``state-key-custody``): a state key version that stored payloads use but the runtime file
no longer configures; a configured version whose key file does not match the recorded
fingerprint; an admission key that does not match. Startup and deployment-status also
refuse a configured key that apply has not recorded yet, so nothing is ever written under
a key whose custody is unknown; apply records it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import asyncpg

from core.codes import Code
from core.config.model import RuntimeConfig
from core.db.statements import Statements
from core.errors import CoordinatorError
from core.keys import admission_key_fingerprint, state_key_fingerprints
from core.paths import index
from core.secrets import SecretResolver


@dataclass(frozen=True)
class CustodyRecords:
    """What the database knows about the keys."""

    state: Mapping[int, str]
    """Recorded fingerprint per state key version."""
    admission: str | None
    """Recorded admission key fingerprint, if any."""
    in_use: tuple[int, ...]
    """State key versions that stored payloads were written with."""


@dataclass(frozen=True)
class ConfiguredKeys:
    """Fingerprints of the keys the runtime file configures (state keys and admission key)."""

    state: Mapping[int, str]
    """Fingerprint per configured state key version."""
    admission: str
    """Fingerprint of the admission key."""
    state_paths: Mapping[int, str]
    """Key path of each version's reference, for refusals."""


def configured_keys(config: RuntimeConfig, resolver: SecretResolver) -> ConfiguredKeys:
    """Read and fingerprint the state keys and the admission key of ``config``."""
    paths = {
        item.version: index("deployment.stateKeys", position)
        for position, item in enumerate(config.deployment.state_keys)
    }
    return ConfiguredKeys(
        state=dict(state_key_fingerprints(config, resolver)),
        admission=admission_key_fingerprint(config, resolver),
        state_paths=paths,
    )


async def read_records(conn: asyncpg.Connection, queries: Statements) -> CustodyRecords:
    """The custody rows and the state key versions in use."""
    state: dict[int, str] = {}
    admission: str | None = None
    for row in await queries.custody_list(conn):
        if row.key_kind == "state":
            state[row.key_version] = row.fingerprint
        else:
            admission = row.fingerprint
    used = await queries.state_key_versions_in_use(conn)
    in_use = tuple(row.version for row in used)
    return CustodyRecords(state=state, admission=admission, in_use=in_use)


def check_custody(records: CustodyRecords, keys: ConfiguredKeys, *, require_recorded: bool) -> None:
    """Refuse when the configured keys break custody (see the module docstring)."""
    for version in records.in_use:
        if version not in keys.state:
            raise CoordinatorError(
                Code.STATE_KEY_CUSTODY,
                f"deployment.stateKeys: state key version {version} is used by stored "
                "payloads but is not configured",
            )
    for version, value in sorted(keys.state.items()):
        recorded = records.state.get(version)
        path = keys.state_paths.get(version, "deployment.stateKeys")
        if recorded is not None and recorded != value:
            raise CoordinatorError(
                Code.STATE_KEY_CUSTODY,
                f"{path}: state key version {version} does not match its recorded fingerprint",
            )
        if recorded is None and require_recorded:
            raise CoordinatorError(
                Code.STATE_KEY_CUSTODY,
                f"{path}: state key version {version} has no recorded fingerprint; run apply",
            )
    if records.admission is not None and records.admission != keys.admission:
        raise CoordinatorError(
            Code.STATE_KEY_CUSTODY,
            "deployment.admissionKeyRef: the admission key does not match its recorded fingerprint",
        )
    if records.admission is None and require_recorded:
        raise CoordinatorError(
            Code.STATE_KEY_CUSTODY,
            "deployment.admissionKeyRef: no fingerprint is recorded; run apply",
        )


async def record_new_keys(
    conn: asyncpg.Connection,
    queries: Statements,
    records: CustodyRecords,
    keys: ConfiguredKeys,
) -> None:
    """Record the fingerprints of keys seen for the first time (apply only)."""
    if records.admission is None:
        await queries.custody_record(
            conn, key_kind="admission", key_version=0, fingerprint=keys.admission
        )
    for version, value in sorted(keys.state.items()):
        if version not in records.state:
            await queries.custody_record(
                conn, key_kind="state", key_version=version, fingerprint=value
            )
