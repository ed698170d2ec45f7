"""One cached OAuth token client per connection, made on first use.

Each connection of the runtime file calls its product as its own client of the
deployment's issuer; its private key is read from its secret reference the first time the
connection is used, and the issuer's discovery document is fetched once for all of them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from core.config.model import RuntimeConfig
from core.products.http import Exchanger
from core.products.token_client import (
    IssuerDiscovery,
    TokenClient,
    TokenUnavailable,
    credentials_for,
)
from core.secrets import SecretResolver


class ConnectionTokens:
    """Access tokens by connection name."""

    def __init__(
        self,
        config: RuntimeConfig,
        resolver: SecretResolver,
        http: Exchanger,
        *,
        clients: Mapping[str, TokenClient] | None = None,
    ) -> None:
        self._config = config
        self._resolver = resolver
        self._http = http
        self._discovery = IssuerDiscovery(http, config.deployment.authentication.issuer)
        self._clients: dict[str, TokenClient] = dict(clients or {})
        self._lock = asyncio.Lock()
        self.confirmed: set[str] = set()
        """Connections a token was obtained for since this process started or since
        their last refusal: the dispatcher clears a recorded refusal once per entry."""

    async def client(self, connection: str) -> TokenClient:
        """The token client of ``connection`` (made, and its key read, on first use)."""
        found = self._clients.get(connection)
        if found is not None:
            return found
        async with self._lock:
            found = self._clients.get(connection)
            if found is None:
                settings = self._config.connections.get(connection)
                if settings is None:
                    raise TokenUnavailable(
                        f"connection '{connection}' is not in the runtime file", retryable=False
                    )
                # Reading a file is blocking; keep it off the event loop.
                jwk = await asyncio.to_thread(
                    self._resolver.read_jwk, settings.authorization.signing_key_ref
                )
                audience = self._config.deployment.authentication.client_assertion_audience
                found = TokenClient(
                    self._http, self._discovery, credentials_for(settings, jwk, audience)
                )
                self._clients[connection] = found
        return found

    async def token(self, connection: str) -> str:
        """A current access token for ``connection``."""
        return await (await self.client(connection)).token()

    def cached(self, connection: str) -> str | None:
        """``connection``'s access token when one is cached and current, without asking
        the issuer; ``None`` otherwise."""
        found = self._clients.get(connection)
        return None if found is None else found.cached()

    def invalidate(self, connection: str) -> None:
        """Forget ``connection``'s cached token (after a product answered 401)."""
        found = self._clients.get(connection)
        if found is not None:
            found.invalidate()
