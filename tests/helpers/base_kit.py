"""What the in-process integration kits share: an applied deployment, an admission store,
a migration connection to read and force state, and HTTP routed through a
:class:`~tests.helpers.devstack_kit.HostRouter`.

:class:`BaseKit` holds those and the reads every kit's tests make (run, step, payload rows);
:func:`applied` applies a prepared deployment, :func:`dev_issuer` makes the issuer, and
:func:`write_packages` packages workflow sources into a deployment.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import yaml

from core import deploy
from core.config.model import CheckedDeployment
from core.crypto import Keyring, Sealed
from core.keys import resolver_for
from core.payloads import open_json
from core.products.http import Exchanger
from core.rpc.transport import Endpoints
from core.runtime import Runtime, Store
from core.secrets import SecretResolver
from core.workflow.package import MANIFEST, SOURCE, build_manifest, digest_of
from devstack.issuer import DevIssuer, IssuerState, RegisteredClient
from dispatcher.engine import Dispatcher
from dispatcher.settings import DispatchSettings
from tests.helpers.deployment import TestDeployment
from tests.helpers.devstack_kit import HostRouter

ISSUER = "https://issuer.example.org"


@dataclass
class BaseKit:
    """An applied deployment with its stores, owner connection and HTTP routing."""

    deployment: TestDeployment
    checked: CheckedDeployment
    runtime: Runtime
    admission: Store
    db: asyncpg.Connection
    router: HostRouter
    http: Exchanger
    """The dispatcher's and recovery's product client: the router's stand-ins in-process
    (:class:`tests.helpers.asgi_http.AsgiHttp`), or real sockets."""
    keyring: Keyring
    stores: list[Store] = field(default_factory=list, kw_only=True)
    """Stores the kit opened for its dispatchers; closed by :meth:`close`."""

    @property
    def ns(self) -> str:
        """The quoted namespace, for test SQL."""
        return f'"{self.deployment.namespace}"'

    async def dispatcher(
        self, settings: DispatchSettings | None = None, owner: str | None = None
    ) -> Dispatcher:
        """A dispatcher with its own verified store and this kit's HTTP routing."""
        store = Store(self.runtime, "dispatcher")
        self.stores.append(store)
        await store.open()
        await store.verify()
        return Dispatcher.from_store(store, self.http, settings=settings, owner=owner)

    async def run(self, run_id: str) -> asyncpg.Record:
        """The run's row."""
        row = await self.db.fetchrow(f"SELECT * FROM {self.ns}.run WHERE id = $1", run_id)
        assert row is not None
        return row

    async def find_step(self, run_id: str, step_id: str) -> asyncpg.Record | None:
        """One step row; ``None`` when the run has not reached it."""
        return await self.db.fetchrow(
            f"SELECT * FROM {self.ns}.step WHERE run_id = $1 AND step_id = $2", run_id, step_id
        )

    async def step_ids(self, run_id: str) -> list[str]:
        """The steps the run reached, in order."""
        rows = await self.db.fetch(
            f"SELECT step_id FROM {self.ns}.step WHERE run_id = $1 ORDER BY seq", run_id
        )
        return [row["step_id"] for row in rows]

    async def payload(self, run_id: str, step_id: str | None, purpose: str) -> Any:
        """A payload (a run's own when ``step_id`` is ``None``), decrypted; ``None`` when
        there is none."""
        row = await self.db.fetchrow(
            f"SELECT * FROM {self.ns}.payload WHERE run_id = $1 "
            "AND step_id IS NOT DISTINCT FROM $2 AND purpose = $3",
            run_id,
            step_id,
            purpose,
        )
        if row is None:
            return None
        sealed = Sealed(row["key_version"], row["nonce"], row["ciphertext"])
        return open_json(self.keyring, self.deployment.namespace, run_id, purpose, sealed)

    async def close(self) -> None:
        """Close the kit's stores, its owner connection and its HTTP client."""
        for store in self.stores:
            await store.close()
        await self.admission.close()
        await self.db.close()
        await self.http.close()


async def applied(deployment: TestDeployment) -> tuple[CheckedDeployment, SecretResolver, Runtime]:
    """Check and apply ``deployment``; answers it checked, its key resolver and a runtime."""
    checked = deployment.checked()
    await deploy.apply(checked, [])
    resolver = resolver_for(checked.config)
    return checked, resolver, Runtime(checked, resolver, Endpoints({}), recovery_only=False)


def dev_issuer(tmp_path: Path, clients: Iterable[RegisteredClient]) -> DevIssuer:
    """The development issuer at :data:`ISSUER` on the wall clock, for ``clients``."""
    return DevIssuer(
        IssuerState.create(tmp_path / "issuer", ISSUER), list(clients), clock=time.time
    )


def write_package(directory: Path, source: bytes) -> tuple[Path, str]:
    """Write a package of ``source`` under ``directory``; answers its root and digest."""
    document = yaml.safe_load(source)
    workflow_id, version = document["id"], document["version"]
    manifest = build_manifest(workflow_id, version, document["connections"], source)
    root = directory / f"{workflow_id}-{version}"
    root.mkdir(parents=True)
    (root / SOURCE).write_bytes(source)
    (root / MANIFEST).write_bytes(manifest)
    return root, digest_of(manifest)


def write_packages(deployment: TestDeployment, sources: Iterable[bytes]) -> None:
    """Package every workflow source into ``deployment`` and list the packages in it."""
    packages = []
    for source in sources:
        root, digest = write_package(deployment.packages_dir, source)
        packages.append({"root": str(root), "expectedDigest": digest})
    deployment.doc["deployment"]["packages"] = packages
