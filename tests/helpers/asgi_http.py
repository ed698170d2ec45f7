"""The stand-ins served in-process: an :class:`core.products.http.Exchanger` over a
:class:`tests.helpers.devstack_kit.HostRouter`, for tests of what the dispatcher and
recovery decide rather than of the wire (``tests/fault/test_hostile_products.py`` and the
loopback variants cover the wire)."""

from __future__ import annotations

import ssl
from collections.abc import Mapping

import httpx

from core.products.http import (
    CONNECTION_LOST,
    NEVER_CONNECTED,
    TIMEOUT_AFTER_SEND,
    Answer,
    ExchangeFailure,
)


class AsgiHttp:
    """Requests answered by the router's ASGI apps, failures told as the wire would."""

    def __init__(self, transport: httpx.AsyncBaseTransport) -> None:
        self._client = httpx.AsyncClient(transport=transport)

    async def exchange(
        self,
        method: str,
        url: str,
        *,
        headers: Mapping[str, str],
        body: bytes | None = None,
        timeout: float,
        tls: ssl.SSLContext | None = None,
    ) -> Answer:
        try:
            answer = await self._client.request(
                method, url, content=body, headers=dict(headers), timeout=timeout
            )
        except httpx.ConnectError:
            raise ExchangeFailure(NEVER_CONNECTED, sent=False) from None
        except httpx.TimeoutException:
            raise ExchangeFailure(TIMEOUT_AFTER_SEND, sent=True) from None
        except Exception:
            # A stand-in that drops the connection raises inside the app.
            raise ExchangeFailure(CONNECTION_LOST, sent=True) from None
        return Answer(answer.status_code, answer.content, answer.headers.get("retry-after"))

    async def close(self) -> None:
        await self._client.aclose()

    async def __aenter__(self) -> AsgiHttp:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
