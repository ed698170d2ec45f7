"""A small, complete deployment on a test database: runtime file, packages, keys, URLs.

``TestDeployment.create(tmp_path, database)`` writes the secret folder (the harness's URL
files and CA, plus the three keys), one package per requested workflow, and a runtime
file naming them. Tests change the document (``doc``), packages or key files and call
``checked()`` again; each call reloads the runtime file as coordinatorctl would.
"""

# Test SQL names the test's own namespace, made by unique_namespace(), never input.

from __future__ import annotations

import os
import secrets
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from core.config.check import check_runtime_file
from core.config.model import CheckedDeployment
from devstack.postgres import DatabaseHandle, postgres_url
from tests.helpers.packages import make_package

CONNECTIONS = {"notices": "messaging"}


def unique_namespace(prefix: str = "t") -> str:
    """A namespace (and so component role names) no other test in the cluster uses."""
    return f"coordinator_{prefix}_{secrets.token_hex(6)}"


def write_secret(folder: Path, name: str, data: bytes) -> Path:
    """Write an owner-only secret file (0600), replacing any earlier content."""
    path = folder / name
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    return path


@dataclass
class TestDeployment:
    """One deployment's files; ``doc`` is the runtime document written by ``write()``."""

    __test__ = False  # not a test class, despite its name

    directory: Path
    database: DatabaseHandle
    namespace: str
    doc: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)

    @property
    def secrets(self) -> Path:
        return self.directory / "secrets"

    @property
    def runtime_file(self) -> Path:
        return self.directory / "runtime.yaml"

    @property
    def packages_dir(self) -> Path:
        return self.directory / "packages"

    @classmethod
    def create(
        cls,
        directory: Path,
        database: DatabaseHandle,
        *,
        workflows: tuple[str, ...] = ("approval-notice",),
        namespace: str | None = None,
    ) -> TestDeployment:
        deployment = cls(directory, database, namespace or unique_namespace())
        database.write_secret_files(deployment.secrets)
        for name in ("state-key-1", "admission-key", "audit-key"):
            write_secret(deployment.secrets, name, secrets.token_bytes(32))
        deployment.doc = deployment._document()
        for workflow_id in workflows:
            deployment.pin(workflow_id, "1.0.0")
        deployment.write()
        return deployment

    def _document(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "secretProviders": {"file": {"root": "secrets"}},
            "database": {
                "runtimeUrlRef": "secret:file/runtime-db-url",
                "migrationUrlRef": "secret:file/migration-db-url",
                "trustedRootCertificateRef": "secret:file/db-root.pem",
            },
            "deployment": {
                "databaseId": str(uuid.uuid4()),
                "runtimeRole": self.database.runtime_role,
                "packages": [],
                "listener": {
                    "bind": "127.0.0.1:8108",
                    "tlsTermination": "operator-controlled-upstream",
                },
                "authentication": {
                    "issuer": "https://issuer.example.org",
                    "audience": "https://coordinator.example.org",
                    "signingKeys": {"jwksUrl": "https://issuer.example.org/jwks"},
                    "policies": {
                        "platform-operators": {"operator": True, "actions": ["doctor"]},
                    },
                },
                "auditFile": "audit/audit.jsonl",
                "auditKeyRef": "secret:file/audit-key",
                "stateKeys": [{"version": 1, "ref": "secret:file/state-key-1"}],
                "activeStateKey": 1,
                "admissionKeyRef": "secret:file/admission-key",
            },
            "connections": {
                "notices": {
                    "type": "messaging",
                    "baseUrl": "https://messaging.internal.example.org",
                    "profile": "applicant-notices",
                    "authorization": {
                        "clientId": "coordinator-notices",
                        "signingKeyRef": "secret:file/notices-client.jwk",
                        "scopes": ["messages:send"],
                    },
                }
            },
        }

    # ---- packages

    def pin(self, workflow_id: str, version: str) -> str:
        """Build (if needed) and pin ``workflow_id`` at ``version``; answer its digest."""
        root = self.packages_dir / f"{workflow_id}-{version}"
        if root.exists():
            from core.workflow.package import digest_of

            digest = digest_of((root / "manifest.json").read_bytes())
        else:
            root, digest = make_package(self.packages_dir, workflow_id, CONNECTIONS, version)
        pins = [
            entry
            for entry in self.doc["deployment"]["packages"]
            if not Path(entry["root"]).name.startswith(f"{workflow_id}-")
        ]
        pins.append({"root": str(root), "expectedDigest": digest})
        self.doc["deployment"]["packages"] = pins
        self.versions[workflow_id] = version
        return digest

    def unpin(self, workflow_id: str) -> None:
        """Drop ``workflow_id``'s packages entry."""
        self.doc["deployment"]["packages"] = [
            entry
            for entry in self.doc["deployment"]["packages"]
            if not Path(entry["root"]).name.startswith(f"{workflow_id}-")
        ]
        self.versions.pop(workflow_id, None)

    # ---- files

    def write(self) -> Path:
        self.runtime_file.write_text(yaml.safe_dump(self.doc, sort_keys=False), "utf-8")
        return self.runtime_file

    def checked(self) -> CheckedDeployment:
        """Write the document and check it as coordinatorctl does."""
        return check_runtime_file(self.write())

    def set_runtime_login(self, role: str, password: str) -> None:
        """Point runtimeUrlRef and deployment.runtimeRole at another login role."""
        url = postgres_url(
            role, password, self.database.host, self.database.port, self.database.database
        )
        write_secret(self.secrets, "runtime-db-url", url.encode())
        self.doc["deployment"]["runtimeRole"] = role


async def migration_connection(database: DatabaseHandle) -> Any:
    """A connection as the migration role (it owns the schema once apply ran)."""
    from core.db.connect import connect

    return await connect(database.migration_url, database.ca_pem)


async def insert_run(
    database: DatabaseHandle,
    namespace: str,
    workflow_id: str,
    digest: str,
    *,
    ended: bool = False,
) -> str:
    """Insert a run row directly, as the migration role; answer its id."""
    run_id = f"run-{secrets.token_hex(8)}"
    conn = await migration_connection(database)
    try:
        await conn.execute(
            f'INSERT INTO "{namespace}".run (id, workflow_id, package_digest, principal_iss, '
            "principal_sub, client_id, state, outcome, ended_at) "
            "VALUES ($1, $2, $3, 'https://issuer.example.org', 'someone', 'intake', $4, $5, "
            f"CASE WHEN $4 = 'succeeded' THEN \"{namespace}\".now() END)",
            run_id,
            workflow_id,
            digest,
            "succeeded" if ended else "running",
            "completed" if ended else None,
        )
    finally:
        await conn.close()
    return run_id


async def drop_deployment(database: DatabaseHandle, *namespaces: str) -> None:
    """Drop the namespaces and their component roles (roles outlive the test database)."""
    from core.db.roles import component_roles

    conn = await migration_connection(database)
    try:
        for namespace in namespaces:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{namespace}" CASCADE')
            for role in component_roles(namespace).values():
                await conn.execute(f'DROP ROLE IF EXISTS "{role}"')
    finally:
        await conn.close()
