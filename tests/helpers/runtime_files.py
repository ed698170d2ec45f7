"""A complete, valid runtime file for tests, as a plain document to mutate and write.

``complete_runtime(directory)`` builds three packages under ``directory/packages`` and
returns a document that uses every section of the runtime file: both secret providers,
event sources, a metrics listener, an internal socket folder, the three kinds of policy,
two state key versions and connections of all four types (two of them Casework, each with a
completion block). The secret root ``directory/secrets`` is not created: nothing that
checks the file may need it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from core.config import check_runtime_file
from core.config.model import RuntimeConfig
from core.errors import ConfigInvalid
from core.secrets import SecretRef
from tests.helpers.packages import make_package

DATABASE_ID = "5b8e3c1e-7d2a-4c1f-9a57-0b8f1a2d9c44"


def complete_runtime(directory: Path) -> dict[str, Any]:
    """A valid runtime document whose packages live under ``directory/packages``."""
    packages = directory / "packages"
    approval = make_package(
        packages,
        "approval-notice",
        {"review": "casework-review-producer", "notices": "messaging"},
    )
    booking = make_package(
        packages, "slot-booking", {"slots": "scheduling", "register": "breg-action"}
    )
    escalation = make_package(packages, "escalation", {"escalation": "casework-review-producer"})
    return {
        "namespace": "coordinator_test",
        "secretProviders": {"file": {"root": "secrets"}, "environment": {}},
        "database": {
            "runtimeUrlRef": "secret:file/runtime-db-url",
            "migrationUrlRef": "secret:env/COORDINATOR_MIGRATION_URL",
            "trustedRootCertificateRef": "secret:file/db-root.pem",
        },
        "eventSources": {
            "intake": {
                "source": "https://intake.example.org/applications",
                "signingKeyRef": "secret:file/intake-event-hmac",
                "workflow": "approval-notice",
            },
            "bookings": {
                "source": "urn:example:bookings",
                "signingKeyRef": "secret:file/bookings-event-hmac",
                "workflow": "slot-booking",
            },
        },
        "deployment": {
            "databaseId": DATABASE_ID,
            "runtimeRole": "coordinator_runtime",
            "packages": [
                {"root": str(approval[0]), "expectedDigest": approval[1]},
                {"root": "packages/slot-booking-1.0.0", "expectedDigest": booking[1]},
                {"root": str(escalation[0]), "expectedDigest": escalation[1]},
            ],
            "listener": {
                "bind": "127.0.0.1:8108",
                "tlsTermination": "operator-controlled-upstream",
                "publicUrl": "https://coordinator.example.org",
            },
            "metricsListener": {"bind": "10.1.2.3:9108"},
            "internal": {"socketDir": "sockets"},
            "authentication": {
                "issuer": "https://issuer.example.org",
                "audience": "https://coordinator.example.org",
                "signingKeys": {"jwksUrl": "https://issuer.example.org/jwks"},
                "algorithms": ["RS256", "ES256"],
                "clockSkewSeconds": 30,
                "policies": {
                    "intake-portal": {
                        "workflows": ["approval-notice"],
                        "actions": ["start", "status"],
                    },
                    "case-operators": {
                        "operator": True,
                        "workflows": ["approval-notice", "slot-booking"],
                        "actions": ["inspect", "status", "retry-same", "cancel", "reconcile"],
                    },
                    "platform-operators": {
                        "operator": True,
                        "actions": [
                            "doctor",
                            "restore-hold",
                            "release-restore-hold",
                            "release-admission-hold",
                            "complete-execution-recovery",
                            "retain",
                        ],
                    },
                },
            },
            "auditFile": "audit/audit.jsonl",
            "auditKeyRef": "secret:file/audit-key",
            "stateKeys": [
                {"version": 1, "ref": "secret:file/state-key-1"},
                {"version": 2, "ref": "secret:file/state-key-2"},
            ],
            "activeStateKey": 2,
            "admissionKeyRef": "secret:file/admission-key",
        },
        "connections": {
            "review": {
                "type": "casework-review-producer",
                "baseUrl": "https://casework.internal.example.org",
                "profile": "licensing-reviews",
                "producer": "coordinator",
                "authorization": {
                    "clientId": "coordinator-review",
                    "signingKeyRef": "secret:file/review-client.jwk",
                    "scopes": ["review-requests:write", "review-requests:read"],
                    "audience": "https://casework.internal.example.org",
                },
                "completion": {
                    "recipientBinding": "coordinator-v1",
                    "bearerTokenRef": "secret:file/review-completion-token",
                },
                "resultCheckSeconds": 600,
            },
            "escalation": {
                "type": "casework-review-producer",
                "baseUrl": "https://casework.internal.example.org",
                "profile": "escalations",
                "producer": "coordinator",
                "authorization": {
                    "clientId": "coordinator-escalation",
                    "signingKeyRef": "secret:file/escalation-client.jwk",
                    "scopes": ["review-requests:write", "review-requests:read"],
                },
                "completion": {
                    "recipientBinding": "coordinator-escalation-v1",
                    "bearerTokenRef": "secret:file/escalation-completion-token",
                },
            },
            "notices": {
                "type": "messaging",
                "baseUrl": "https://messaging.internal.example.org",
                "profile": "applicant-notices",
                "authorization": {
                    "clientId": "coordinator-notices",
                    "signingKeyRef": "secret:file/notices-client.jwk",
                    "scopes": ["messages:send", "receipts:read"],
                },
            },
            "slots": {
                "type": "scheduling",
                "baseUrl": "https://scheduling.internal.example.org/api",
                "profile": "appointments",
                "authorization": {
                    "clientId": "coordinator-slots",
                    "signingKeyRef": "secret:file/slots-client.jwk",
                    "scopes": ["bookings:write"],
                },
            },
            "register": {
                "type": "breg-action",
                "baseUrl": "https://breg.internal.example.org",
                "profile": "licences",
                "authorization": {
                    "clientId": "coordinator-register",
                    "signingKeyRef": "secret:file/register-client.jwk",
                    "scopes": ["actions:submit"],
                },
            },
        },
    }


def write_runtime(path: Path, document: Any) -> Path:
    """Write ``document`` as YAML to ``path`` and return the path."""
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    return path


# -- mutations: small edits of a runtime document, for refusal tests ----------------------

Mutation = Callable[[dict[str, Any], Path], None]
"""Edits a runtime document in place; the path is the test's folder (for extra packages)."""

_DELETE = object()


@dataclass(frozen=True, eq=False)
class Edit:
    """Sets the entry at ``keys`` (keys and list positions) to ``value``, or deletes it."""

    keys: tuple[str | int, ...]
    value: Any = _DELETE

    def __call__(self, document: dict[str, Any], _: Path) -> None:
        parent: Any = document
        for key in self.keys[:-1]:
            parent = parent[key]
        if self.value is _DELETE:
            del parent[self.keys[-1]]
        else:
            parent[self.keys[-1]] = self.value

    @property
    def path(self) -> str:
        """The key path a refusal names for this entry: ``("a", 1, "b")`` is ``a[1].b``."""
        parts: list[str] = []
        for key in self.keys:
            if isinstance(key, int):
                parts.append(f"[{key}]")
            else:
                parts.append(f".{key}" if parts else key)
        return "".join(parts)


def put(keys: tuple[str | int, ...], value: Any) -> Edit:
    """Set the value at ``keys``, creating the last key."""
    return Edit(keys, value)


def drop(keys: tuple[str | int, ...]) -> Edit:
    """Delete the entry at ``keys``."""
    return Edit(keys)


def both(*mutations: Mutation) -> Mutation:
    """Apply several mutations in order."""

    def mutate(document: dict[str, Any], directory: Path) -> None:
        for mutation in mutations:
            mutation(document, directory)

    return mutate


# -- refusal cases: the offline check refuses an edited document at one key path ---------


def refusal(case_id: str, mutation: Mutation, at: str | None = None) -> pytest.ParameterSet:
    """A ``(mutation, path)`` case: the edited document is refused at ``at``, by default at
    the entry an :class:`Edit` touches."""
    if at is None:
        if not isinstance(mutation, Edit):
            raise TypeError(f"{case_id}: only an Edit knows its path; name the refused one")
        at = mutation.path
    return pytest.param(mutation, at, id=case_id)


def assert_refused_at(directory: Path, mutation: Mutation, path: str) -> None:
    """Check that :func:`complete_runtime`, edited by ``mutation``, is refused with
    ``config.invalid`` at exactly ``path``."""
    document = complete_runtime(directory)
    mutation(document, directory)
    runtime = write_runtime(directory / "runtime.yaml", document)
    with pytest.raises(ConfigInvalid) as caught:
        check_runtime_file(runtime)
    assert caught.value.code == "config.invalid"
    assert caught.value.path == path
    assert caught.value.cli_line().startswith(f"coordinator.config.invalid: {path}: ")


def secret_refs(config: RuntimeConfig) -> tuple[tuple[str, SecretRef], ...]:
    """Every secret reference of ``config`` with its key path, in file order."""
    refs: list[tuple[str, SecretRef]] = [
        ("database.runtimeUrlRef", config.database.runtime_url_ref),
        ("database.migrationUrlRef", config.database.migration_url_ref),
    ]
    if config.database.trusted_root_certificate_ref is not None:
        refs.append(
            ("database.trustedRootCertificateRef", config.database.trusted_root_certificate_ref)
        )
    for name, event_source in config.event_sources.items():
        refs.append((f"eventSources.{name}.signingKeyRef", event_source.signing_key_ref))
    dep = config.deployment
    tls = dep.internal.tls if dep.internal is not None else None
    if tls is not None:
        refs.append(("deployment.internal.tls.certificateRef", tls.certificate_ref))
        refs.append(("deployment.internal.tls.privateKeyRef", tls.private_key_ref))
        refs.append(
            (
                "deployment.internal.tls.trustedRootCertificateRef",
                tls.trusted_root_certificate_ref,
            )
        )
    if dep.authentication.signing_keys.jwks_ref is not None:
        refs.append(
            (
                "deployment.authentication.signingKeys.jwksRef",
                dep.authentication.signing_keys.jwks_ref,
            )
        )
    refs.append(("deployment.auditKeyRef", dep.audit_key_ref))
    for position, state_key in enumerate(dep.state_keys):
        refs.append((f"deployment.stateKeys[{position}].ref", state_key.ref))
    refs.append(("deployment.admissionKeyRef", dep.admission_key_ref))
    for name, connection in config.connections.items():
        refs.append(
            (
                f"connections.{name}.authorization.signingKeyRef",
                connection.authorization.signing_key_ref,
            )
        )
        if connection.completion is not None:
            refs.append(
                (
                    f"connections.{name}.completion.bearerTokenRef",
                    connection.completion.bearer_token_ref,
                )
            )
        if connection.trusted_root_certificate_ref is not None:
            refs.append(
                (
                    f"connections.{name}.trustedRootCertificateRef",
                    connection.trusted_root_certificate_ref,
                )
            )
    return tuple(refs)
