"""auditd: the only writer of the audit journal, serving the Audit gRPC service.

Other components (the gateway first of all) send records here and release an answer only
after this service has written and fsynced them. When the journal cannot be written the
append is refused with ``audit.response-unavailable`` and the component reports not ready
(``audit-unavailable``) until a write succeeds again: the next append tries the disk again,
and so does each health check while no append arrives, so ``/ready`` turns back by itself
once the disk does.

A journal that cannot be opened stops auditd with one line naming the journal's code, the
file and, for a torn last line, the command that seals it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable
from pathlib import Path

import grpc

from auditd.journal import AuditEntry, Journal, Write
from core import logs
from core.audit.format import TornTail
from core.codes import Code
from core.errors import CoordinatorError
from core.metrics import exposition, gauge, merge, new_registry, render
from core.own_metrics import own_metrics
from core.rpc import coordinator_pb2 as pb
from core.rpc import coordinator_pb2_grpc as pb_grpc
from core.rpc.errors import refusals
from core.rpc.transport import server
from core.runtime import Runtime, Store

log = logging.getLogger("coordinator.auditd")


def entry_from_proto(record: pb.AuditRecord) -> AuditEntry:
    """The journal entry for one wire record (empty strings mean absent)."""
    principal = (
        (record.principal_iss, record.principal_sub)
        if record.principal_iss or record.principal_sub
        else None
    )
    return AuditEntry(
        action=record.action,
        outcome=record.outcome,
        principal=principal,
        client_id=record.client_id or None,
        run_id=record.run_id or None,
        reason=record.reason or None,
    )


class AuditService(pb_grpc.AuditServicer):
    """Append records to the journal; report readiness and metrics."""

    def __init__(self, journal: Journal, store: Store) -> None:
        self.journal = journal
        self.store = store
        self.registry = new_registry("auditd")

    @refusals
    async def Append(
        self, request: pb.AppendRequest, context: grpc.aio.ServicerContext
    ) -> pb.AppendReply:
        try:
            entries = [entry_from_proto(record) for record in request.records]
        except ValueError:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "malformed audit record")
        seqs = await self.journal.append(entries)
        return pb.AppendReply(seqs=seqs)

    @refusals
    async def Check(self, request: pb.Empty, context: grpc.aio.ServicerContext) -> pb.Health:
        # While the journal is failing, each check tries the disk again (one write at most,
        # shared with any append in flight), so readiness returns without waiting for traffic.
        ready = self.journal.ready or await self.journal.recover()
        reasons = [] if ready else ["audit-unavailable"]
        return pb.Health(
            store_ready=self.store.available,
            activation_ready=self.store.activation is not None,
            reasons=reasons,
        )

    @refusals
    async def Metrics(self, request: pb.Empty, context: grpc.aio.ServicerContext) -> pb.MetricsText:
        return pb.MetricsText(text=await self.metrics_text())

    async def metrics_text(self) -> str:
        """The journal's readiness gauge (trying a failed disk again) and this process's
        series, as exposition text."""
        ready = 1 if self.journal.ready or await self.journal.recover() else 0
        audit_ready = gauge(
            "coordinator_audit_ready", "1 when the audit journal accepts records.", [((), ready)]
        )
        return merge([render([audit_ready]), exposition(self.registry)])


async def record_segment(store: Store, journal: Journal) -> None:
    """Record the journal segment's key fingerprint in the database (custody, §7.4)."""
    if journal.segment_start_seq is None:
        return
    async with store.connection() as conn:
        latest = await store.queries.audit_segment_latest(conn)
        if latest is not None and latest.fingerprint == journal.key_fingerprint:
            return
        number = 1 if latest is None else latest.segment + 1
        await store.queries.audit_segment_insert(
            conn,
            segment=number,
            fingerprint=journal.key_fingerprint,
            first_seq=journal.segment_start_seq,
        )


async def open_journal(
    path: Path,
    key: bytes,
    runtime_file: Path,
    *,
    write: Write = os.write,
    fsync: Callable[[int], None] = os.fsync,
) -> Journal:
    """Open the journal, or refuse with one line: the journal's code, what is wrong and,
    for a torn last line, the command that seals it."""
    try:
        return await Journal.open(path, key, write=write, fsync=fsync)
    except TornTail as torn:
        raise CoordinatorError(
            torn.code,
            f"{torn.code}: {torn.detail}; with auditd stopped, seal it with "
            f"`coordinatorctl --runtime-config {runtime_file} audit seal-tail`",
        ) from None
    except CoordinatorError as refused:
        raise CoordinatorError(refused.code, f"{refused.code}: {refused.detail}") from None
    except OSError as failed:
        # A missing folder, a directory in the file's place, a read-only or full disk at
        # start: say which file and what the system said, as the other refusals do.
        why = failed.strerror or type(failed).__name__
        raise CoordinatorError(
            Code.DEPLOYMENT_REFUSED,
            f"deployment.auditFile {path}: cannot be opened ({why}); it must name a regular "
            "file auditd can create or append to, in an existing folder",
        ) from None


async def serve(
    runtime: Runtime,
    started: asyncio.Event | None = None,
    *,
    write: Write = os.write,
    fsync: Callable[[int], None] = os.fsync,
) -> None:
    """Open the journal and the store, verify the activation, serve until cancelled.

    ``write`` and ``fsync`` are the journal's disk, for tests that make it fail.
    """
    config = runtime.config
    key = runtime.resolver.read_key(config.deployment.audit_key_ref)
    journal = await open_journal(
        config.deployment.audit_file, key, config.path, write=write, fsync=fsync
    )
    store = Store(runtime, "audit")
    grpc_server = server(runtime.endpoints, "auditd")
    service = AuditService(journal, store)
    pb_grpc.add_AuditServicer_to_server(service, grpc_server)
    try:
        await store.open()
        await store.verify()
        await record_segment(store, journal)
        await grpc_server.start()
        logs.serving("auditd", logs.internal_address(runtime.endpoints.address("auditd")))
        if started is not None:
            started.set()
        async with own_metrics(runtime, "auditd", service.metrics_text):
            await grpc_server.wait_for_termination()
    except asyncio.CancelledError:
        raise
    finally:
        # grpc.aio may already be shutting down after a cancellation; close the rest anyway.
        with contextlib.suppress(asyncio.CancelledError):
            await grpc_server.stop(grace=2.0)
        await journal.close()
        await store.close()
