"""The tests' loopback front (:mod:`tests.helpers.loopback`): a stand-in that drops its
connection drops the real socket, so the coordinator's client sees what it would see from
a real product, and one that answers is answered over the wire."""

from __future__ import annotations

import pytest
from starlette.types import Receive, Scope, Send

from core.products.http import CONNECTION_LOST, ExchangeFailure
from devstack.products.faults import ConnectionDropped
from tests.helpers.devstack_kit import HostRouter
from tests.helpers.loopback import loopback


async def _dropping(scope: Scope, receive: Receive, send: Send) -> None:
    raise ConnectionDropped("the stand-in dropped the connection")


async def _answering(scope: Scope, receive: Receive, send: Send) -> None:
    await send({"type": "http.response.start", "status": 201, "headers": []})
    await send({"type": "http.response.body", "body": b'{"ok": true}'})


async def test_a_dropped_connection_is_lost_on_the_wire_and_an_answer_arrives() -> None:
    router = HostRouter({"drops.test": _dropping, "answers.test": _answering})
    async with loopback(router) as http:
        with pytest.raises(ExchangeFailure) as caught:
            await http.exchange("POST", "http://drops.test/x", headers={}, body=b"{}", timeout=5)
        answer = await http.exchange(
            "POST", "http://answers.test/x", headers={}, body=b"{}", timeout=5
        )
    assert (caught.value.cause, caught.value.sent) == (CONNECTION_LOST, True)
    assert (answer.status, answer.body) == (201, b'{"ok": true}')


async def _busy(scope: Scope, receive: Receive, send: Send) -> None:
    headers = [(b"content-type", b"application/json"), (b"retry-after", b"120")]
    await send({"type": "http.response.start", "status": 429, "headers": headers})
    await send({"type": "http.response.body", "body": b"{}"})


async def test_the_real_client_keeps_the_answers_retry_after() -> None:
    router = HostRouter({"busy.test": _busy, "answers.test": _answering})
    async with loopback(router) as http:
        busy = await http.exchange("POST", "http://busy.test/x", headers={}, body=b"{}", timeout=5)
        plain = await http.exchange(
            "POST", "http://answers.test/x", headers={}, body=b"{}", timeout=5
        )
    assert (busy.status, busy.retry_after) == (429, "120")
    assert plain.retry_after is None
