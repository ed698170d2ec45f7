"""Database access shared by the components: verified TLS connections, pools, version checks."""

from core.db.connect import (
    ACCEPTED_SSLMODES,
    DatabaseUrl,
    client_ssl_context,
    connect,
    create_pool,
    parse_database_url,
    quote_ident,
    require_server_version,
    server_version_num,
)

__all__ = [
    "ACCEPTED_SSLMODES",
    "DatabaseUrl",
    "client_ssl_context",
    "connect",
    "create_pool",
    "parse_database_url",
    "quote_ident",
    "require_server_version",
    "server_version_num",
]
