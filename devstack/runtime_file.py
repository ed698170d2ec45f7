"""Generate a complete runtime file and its secrets for the local development stack.

``write_local_deployment`` writes, under one folder::

    runtime.yaml            the runtime file (relative paths, so the folder can move)
    secrets/                0700; every file 0600
      state-key-1, admission-key, audit-key      32 random bytes each
      <connection>-client.jwk                    private EC P-256 JWK (ES256, with kid)
      <connection>-completion-token              Casework connections: completion token
      intake-event-hmac                          32 random bytes: the event source's key
      runtime-db-url, migration-db-url, db-root.pem   copied in when given (see below)
    public/clients.json     {clientId: JWKS of public keys} to register at the dev issuer
    devstack.json           what the stand-ins and the runner need to know (no secret values)
    sockets/                0700, the internal channel's socket folder
    audit.jsonl             (created by auditd, not here)

Product base URLs and the issuer are ``http://127.0.0.1:<port>``; the runtime file check
allows plain http only to loopback hosts, so the result passes ``check_runtime_file``.
The database URL files are the ones ``devstack.postgres`` writes with
``write_secret_files(<folder>/secrets)``: pass them as ``database_secret_files`` to copy
them in now, or write them there later (the check never reads them).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import secrets
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from cryptography.hazmat.primitives.asymmetric import ec
from jwt.algorithms import ECAlgorithm

from core.actions import DEPLOYMENT_ACTIONS, RUN_ACTIONS
from core.config.model import CASEWORK
from core.workflow.package import verify_package

RUNTIME_FILE = "runtime.yaml"
SECRETS_DIR = "secrets"
EVENT_SOURCE = "intake"
EVENT_SOURCE_URI = "urn:registry-stack:devstack:intake"
EVENT_KEY = "intake-event-hmac"

# Port keys: "listener" and "issuer" are required, "metrics" optional, and one key per
# connection type the packages use.
PORT_KEYS = ("listener", "metrics", "issuer")

DEFAULT_PROFILES = {
    "casework-review-producer": "licensing-reviews",
    "messaging": "applicant-notices",
    "scheduling": "appointments",
    "breg-action": "licences",
}
DEFAULT_SCOPES = {
    "casework-review-producer": ["review-requests:write", "review-requests:read"],
    "messaging": ["messages:send", "receipts:read"],
    "scheduling": ["bookings:write", "receipts:read"],
    "breg-action": ["actions:write", "proposals:write"],
}
OPERATOR_RUN_ACTIONS = [name for name in RUN_ACTIONS if name != "start"]
"""What the development operator may do to runs: everything but start them."""

# The database secret files, by the field names of devstack.postgres.SecretFiles.
_DATABASE_FILES = {
    "runtime_url": "runtime-db-url",
    "migration_url": "migration-db-url",
    "trusted_root": "db-root.pem",
}


def write_local_deployment(
    directory: Path,
    *,
    packages: list[tuple[Path, str]],
    database_secret_files: Mapping[str, Path] | None,
    ports: Mapping[str, int],
    namespace: str = "coordinator_local",
    runtime_role: str = "coordinator_runtime",
    producer_client_id: str = "devstack-producer",
    operator_client_id: str = "devstack-operator",
    event_workflow: str | None = None,
    result_check_seconds: int = 60,
    jwks_path: str = "/jwks",
    profiles: Mapping[str, str] | None = None,
    scopes: Mapping[str, list[str]] | None = None,
) -> Path:
    """Write a local runtime file, its secrets and public keys; return the runtime file.

    ``packages`` are ``(root, digest)`` pairs; the connections the runtime file declares
    are the ones those packages need. ``ports`` maps ``listener``, ``issuer``, optionally
    ``metrics``, and each needed connection type (``casework-review-producer``,
    ``messaging``, ``scheduling``, ``breg-action``) to a port on 127.0.0.1.
    ``database_secret_files`` maps ``runtime_url``, ``migration_url`` and optionally
    ``trusted_root`` to files to copy into the secrets folder; ``None`` leaves them to be
    written there later, and the runtime file then names the private root too.
    ``event_workflow`` is the workflow the signed event source starts (the first package's
    by default). Refuses to overwrite an existing runtime file.
    """
    directory = Path(os.path.abspath(directory))
    runtime_path = directory / RUNTIME_FILE
    if runtime_path.exists():
        raise FileExistsError(f"{runtime_path} already exists")
    if not packages:
        raise ValueError("at least one package is needed")
    for name in ("listener", "issuer"):
        if name not in ports:
            raise ValueError(f"ports needs '{name}'")

    verified = [verify_package(root, digest) for root, digest in packages]
    workflow_ids = [package.workflow_id for package in verified]
    needed: dict[str, str] = {}
    for package in verified:
        for name, kind in package.connections.items():
            if needed.setdefault(name, kind) != kind:
                raise ValueError(f"connection '{name}' is needed with two different types")
    for kind in sorted(set(needed.values())):
        if kind not in ports:
            raise ValueError(f"ports needs '{kind}' for the packages' connections")

    directory.mkdir(parents=True, exist_ok=True)
    secret_dir = _private_dir(directory / SECRETS_DIR)
    _private_dir(directory / "sockets")
    for name in ("state-key-1", "admission-key", "audit-key", EVENT_KEY):
        _write_secret(secret_dir / name, secrets.token_bytes(32))

    database: dict[str, str] = {
        "runtimeUrlRef": "secret:file/runtime-db-url",
        "migrationUrlRef": "secret:file/migration-db-url",
    }
    if database_secret_files is None:
        database["trustedRootCertificateRef"] = "secret:file/db-root.pem"
    else:
        for field, source in database_secret_files.items():
            if field not in _DATABASE_FILES:
                raise ValueError(f"unknown database secret file '{field}'")
            _write_secret(secret_dir / _DATABASE_FILES[field], Path(source).read_bytes())
        if "trusted_root" in database_secret_files:
            database["trustedRootCertificateRef"] = "secret:file/db-root.pem"

    issuer = f"http://127.0.0.1:{ports['issuer']}"
    public_url = f"http://127.0.0.1:{ports['listener']}"
    profile_of = {**DEFAULT_PROFILES, **(profiles or {})}
    scopes_of = {**DEFAULT_SCOPES, **(scopes or {})}
    connections: dict[str, Any] = {}
    public_keys: dict[str, Any] = {}
    completions: dict[str, Any] = {}
    for name, kind in sorted(needed.items()):
        client_id = f"coordinator-{name}"
        private_jwk, public_jwk = _signing_key()
        _write_secret(secret_dir / f"{name}-client.jwk", json.dumps(private_jwk).encode())
        public_keys[client_id] = {"keys": [public_jwk]}
        entry: dict[str, Any] = {
            "type": kind,
            "baseUrl": f"http://127.0.0.1:{ports[kind]}",
            "profile": profile_of[kind],
            "authorization": {
                "clientId": client_id,
                "signingKeyRef": f"secret:file/{name}-client.jwk",
                "scopes": list(scopes_of[kind]),
            },
        }
        if kind == CASEWORK:
            token_name = f"{name}-completion-token"
            _write_secret(secret_dir / token_name, secrets.token_hex(32).encode())
            binding = f"coordinator-{name}"
            entry["producer"] = "coordinator"
            entry["completion"] = {
                "recipientBinding": binding,
                "bearerTokenRef": f"secret:file/{token_name}",
            }
            entry["resultCheckSeconds"] = result_check_seconds
            completions[name] = {
                "recipientBinding": binding,
                "tokenFile": str(secret_dir / token_name),
                "producer": "coordinator",
                "profile": profile_of[kind],
            }
        connections[name] = entry

    started_by_events = event_workflow or workflow_ids[0]
    deployment: dict[str, Any] = {
        "databaseId": str(uuid.uuid4()),
        "runtimeRole": runtime_role,
        "packages": [
            {"root": str(Path(os.path.abspath(root))), "expectedDigest": digest}
            for root, digest in packages
        ],
        "listener": {
            "bind": f"127.0.0.1:{ports['listener']}",
            "tlsTermination": "operator-controlled-upstream",
            "publicUrl": public_url,
        },
    }
    if "metrics" in ports:
        deployment["metricsListener"] = {"bind": f"127.0.0.1:{ports['metrics']}"}
    deployment.update(
        {
            "internal": {"socketDir": "sockets"},
            "authentication": {
                "issuer": issuer,
                "audience": public_url,
                "signingKeys": {"jwksUrl": issuer + jwks_path},
                "algorithms": ["RS256", "ES256"],
                "clockSkewSeconds": 60,
                "policies": {
                    producer_client_id: {
                        "workflows": list(workflow_ids),
                        "actions": ["start", "status"],
                    },
                    # One client may hold run actions and deployment-wide actions together:
                    # only a policy made of deployment-wide actions alone must omit workflows.
                    operator_client_id: {
                        "operator": True,
                        "workflows": list(workflow_ids),
                        "actions": OPERATOR_RUN_ACTIONS + list(DEPLOYMENT_ACTIONS),
                    },
                },
            },
            "auditFile": "audit.jsonl",
            "auditKeyRef": "secret:file/audit-key",
            "stateKeys": [{"version": 1, "ref": "secret:file/state-key-1"}],
            "activeStateKey": 1,
            "admissionKeyRef": "secret:file/admission-key",
        }
    )
    document = {
        "namespace": namespace,
        "secretProviders": {"file": {"root": SECRETS_DIR}},
        "database": database,
        "eventSources": {
            EVENT_SOURCE: {
                "source": EVENT_SOURCE_URI,
                "signingKeyRef": f"secret:file/{EVENT_KEY}",
                "workflow": started_by_events,
            }
        },
        "deployment": deployment,
        "connections": connections,
    }

    public_dir = directory / "public"
    public_dir.mkdir(exist_ok=True)
    (public_dir / "clients.json").write_text(json.dumps(public_keys, indent=2) + "\n")
    summary = {
        "runtimeFile": str(runtime_path),
        "secretsDir": str(secret_dir),
        "namespace": namespace,
        "databaseId": deployment["databaseId"],
        "issuer": issuer,
        "audience": public_url,
        "producerClientId": producer_client_id,
        "operatorClientId": operator_client_id,
        "connectionClients": sorted(public_keys),
        "publicKeysFile": str(public_dir / "clients.json"),
        "completions": completions,
        "eventSource": {
            "source": EVENT_SOURCE_URI,
            "keyFile": str(secret_dir / EVENT_KEY),
            "workflow": started_by_events,
        },
        "ports": dict(ports),
    }
    (directory / "devstack.json").write_text(json.dumps(summary, indent=2) + "\n")
    header = "# Generated by devstack.runtime_file for the local stack. Holds no secret values.\n"
    runtime_path.write_text(header + yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    return runtime_path


def _private_dir(path: Path) -> Path:
    path.mkdir(mode=0o700, exist_ok=True)
    os.chmod(path, 0o700)  # mkdir's mode is filtered by the umask
    return path


def _write_secret(path: Path, data: bytes) -> None:
    # Created 0600 from the first byte; O_EXCL so an existing secret is never replaced.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def _signing_key() -> tuple[dict[str, Any], dict[str, Any]]:
    """A fresh ES256 key pair as (private JWK, public JWK), both with the same kid."""
    key = ec.generate_private_key(ec.SECP256R1())
    public: dict[str, Any] = dict(ECAlgorithm.to_jwk(key.public_key(), as_dict=True))
    # RFC 7638 thumbprint: SHA-256 of the required members in lexicographic order.
    members = {name: public[name] for name in ("crv", "kty", "x", "y")}
    canonical = json.dumps(members, separators=(",", ":"), sort_keys=True).encode()
    kid = base64.urlsafe_b64encode(hashlib.sha256(canonical).digest()).rstrip(b"=").decode()
    labels = {"kid": kid, "alg": "ES256", "use": "sig"}
    private: dict[str, Any] = {**dict(ECAlgorithm.to_jwk(key, as_dict=True)), **labels}
    return private, {**public, **labels}
