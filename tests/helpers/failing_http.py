"""An exchanger that fails chosen requests as the real HTTP client would report them, and
passes every other one to the exchanger it wraps (a test's router, in-process or over
loopback). Tests use it for failures a stand-in cannot produce by itself, such as a TLS
certificate that does not verify."""

from __future__ import annotations

import ssl
from collections.abc import Callable, Mapping

from core.products.http import Answer, ExchangeFailure, Exchanger


class FailingHttp:
    """Fails each request for which ``fails(method, url)`` holds with ``cause`` (``sent``
    as the client would say it), while :attr:`failing` is True."""

    def __init__(
        self,
        inner: Exchanger,
        fails: Callable[[str, str], bool],
        cause: str,
        *,
        sent: bool = False,
    ) -> None:
        self.inner = inner
        self._fails = fails
        self._cause = cause
        self._sent = sent
        self.failing = True

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
        if self.failing and self._fails(method, url):
            raise ExchangeFailure(self._cause, sent=self._sent)
        return await self.inner.exchange(
            method, url, headers=headers, body=body, timeout=timeout, tls=tls
        )

    async def close(self) -> None:
        await self.inner.close()
