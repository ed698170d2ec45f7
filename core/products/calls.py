"""Per-connection settings of an outbound exchange: its deadline and whom its TLS trusts."""

from __future__ import annotations

import ssl

from core.config.model import RuntimeConfig
from core.products.tls import connection_ssl_context
from core.secrets import SecretResolver

DEFAULT_CALL_TIMEOUT_SECONDS = 30.0


class ConnectionCalls:
    """The runtime file's ``callTimeoutSeconds`` and ``trustedRootCertificateRef``, by
    connection name; a private root is read the first time its connection calls."""

    def __init__(self, config: RuntimeConfig, resolver: SecretResolver) -> None:
        self._config = config
        self._resolver = resolver
        self._tls: dict[str, ssl.SSLContext | None] = {}

    def timeout(self, connection: str, limit: float | None = None) -> float:
        """The bound on one exchange of ``connection``, never past ``limit`` seconds."""
        settings = self._config.connections.get(connection)
        bound = (
            float(settings.call_timeout_seconds)
            if settings is not None
            else DEFAULT_CALL_TIMEOUT_SECONDS
        )
        return bound if limit is None else max(0.001, min(bound, limit))

    def tls(self, connection: str) -> ssl.SSLContext | None:
        """The TLS context of ``connection``'s calls; None for the system roots."""
        if connection not in self._tls:
            settings = self._config.connections.get(connection)
            if settings is None or settings.trusted_root_certificate_ref is None:
                self._tls[connection] = None
            else:
                self._tls[connection] = connection_ssl_context(settings, self._resolver)
        return self._tls[connection]
