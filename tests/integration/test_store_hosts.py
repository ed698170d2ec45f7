"""A runtime URL that names several hosts (CONTRACT §6.5), against a real server.

The "hosts" are ways to the one test server: a port where nothing listens, a TCP forwarder
the test can cut (TLS still runs end to end through it, between the store and the server),
and the server itself under its other certificate name. Cutting the forwarder is what a
failover looks like from a component: its host is gone with every connection through it,
and the next host in the URL answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from core.codes import Code
from core.db.connect import PEER_SILENCE_SECONDS
from core.errors import CoordinatorError
from core.runtime import Store
from devstack.postgres import DatabaseHandle, postgres_url
from devstack.stack import free_port
from recovery import reads
from tests.helpers.deployment import write_secret
from tests.helpers.dispatching import DispatchKit, dispatch_kit

pytestmark = pytest.mark.postgres

ATTEMPTS = 5
"""New connections a store may need before it reaches the next host: each one that finds
a dead pooled connection costs one refusal (a bound, not a wait)."""


@pytest.fixture
async def kit(tmp_path: Path, database: DatabaseHandle) -> AsyncIterator[DispatchKit]:
    async with dispatch_kit(tmp_path, database) as made:
        yield made


class Forwarder:
    """A TCP listener on 127.0.0.1 that copies bytes to the server and back, until cut."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.port = free_port()
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        self._writers += [writer, up_writer]

        async def copy(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError):
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            sink.close()

        await asyncio.gather(copy(reader, up_writer), copy(up_reader, writer))

    async def cut(self) -> None:
        """Stop listening and drop every connection at once, as a lost host does."""
        assert self._server is not None
        self._server.close()
        for writer in self._writers:
            writer.transport.abort()
        await self._server.wait_closed()


def _use_url(kit: DispatchKit, *hosts: str) -> None:
    database = kit.deployment.database
    url = postgres_url(
        database.runtime_role,
        database.runtime_password,
        "HOSTS",
        0,
        database.database,
    ).replace("HOSTS:0", ",".join(hosts))
    write_secret(
        kit.deployment.secrets,
        "runtime-db-url",
        (url + "&target_session_attrs=read-write").encode(),
    )


async def _store(kit: DispatchKit) -> Store:
    store = Store(kit.runtime, "recovery")
    kit.stores.append(store)
    await store.open()
    await store.verify()
    return store


async def _served_host(store: Store) -> str:
    """The doctor's ``storeHost``, once a connection is served again."""
    for _ in range(ATTEMPTS):
        try:
            doctor = await reads.doctor(store, audit_ready=True, recovery_only=False)
        except CoordinatorError as refused:
            assert refused.code == Code.SERVICE_UNAVAILABLE, refused
            continue
        return str(doctor["state"]["storeHost"])
    raise AssertionError("the store never reached a host")


async def test_the_first_host_that_answers_serves_and_doctor_names_it(kit: DispatchKit) -> None:
    port = kit.deployment.database.port
    nobody = free_port()
    _use_url(kit, f"127.0.0.1:{nobody}", f"localhost:{port}")
    store = await _store(kit)
    assert await _served_host(store) == f"localhost:{port}"


async def test_after_a_failover_the_next_host_serves_once_it_passes_the_activation_checks(
    kit: DispatchKit,
) -> None:
    database = kit.deployment.database
    forwarder = Forwarder(database.host, database.port)
    await forwarder.start()
    _use_url(kit, f"127.0.0.1:{forwarder.port}", f"localhost:{database.port}")
    store = await _store(kit)
    assert await _served_host(store) == f"127.0.0.1:{forwarder.port}"
    recorded = await kit.db.fetchval(f"SELECT database_id::text FROM {kit.ns}.deployment")

    # The next host holds another deployment (a standby of the wrong cluster, say): the
    # checks run on the first connection there, and nothing is served.
    await kit.db.execute(f"UPDATE {kit.ns}.deployment SET database_id = gen_random_uuid()")
    await forwarder.cut()
    refusals = []
    for _ in range(ATTEMPTS):
        try:
            await reads.doctor(store, audit_ready=True, recovery_only=False)
        except CoordinatorError as refused:
            refusals.append(refused.code)
            if refused.code == Code.DEPLOYMENT_REFUSED:
                break
    assert refusals[-1] == Code.DEPLOYMENT_REFUSED, refusals
    assert set(refusals) <= {Code.SERVICE_UNAVAILABLE, Code.DEPLOYMENT_REFUSED}

    # The right database behind the next host: it passes and serves.
    await kit.db.execute(f"UPDATE {kit.ns}.deployment SET database_id = $1::uuid", recorded)
    assert await _served_host(store) == f"localhost:{database.port}"


async def test_a_read_only_server_is_never_used(kit: DispatchKit) -> None:
    database = kit.deployment.database
    name = f'"{database.database}"'
    _use_url(kit, f"localhost:{database.port}")
    store = await _store(kit)
    assert await _served_host(store) == f"localhost:{database.port}"
    # The server now reports every new session read-only, as a standby's are.
    await kit.db.execute(f"ALTER DATABASE {name} SET default_transaction_read_only = on")
    try:
        await store.pool.expire_connections()
        with pytest.raises(CoordinatorError) as refused:
            async with store.connection() as conn:
                await conn.execute("SELECT 1")
        assert refused.value.code == Code.SERVICE_UNAVAILABLE
        assert store.available is False
    finally:
        await kit.db.execute(f"ALTER DATABASE {name} RESET default_transaction_read_only")
    assert await _served_host(store) == f"localhost:{database.port}"


async def test_every_connection_gives_up_on_a_server_that_goes_silent(kit: DispatchKit) -> None:
    database = kit.deployment.database
    _use_url(kit, f"localhost:{database.port}")
    store = await _store(kit)
    async with store.connection() as conn:
        # (the asyncio transport's socket; asyncpg keeps the transport private)
        sock = conn._transport.get_extra_info("socket")
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        silence = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT)
        assert silence == PEER_SILENCE_SECONDS * 1000
        assert 0 < sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) < PEER_SILENCE_SECONDS
