"""TLS client contexts for calls to the downstream products (CONTRACT §5, §9.3).

A connection without ``trustedRootCertificateRef`` verifies its product against the system
roots; with one, against the PEM root(s) that secret holds and nothing else, so a private
product CA does not have to be added to the host's trust store (and the public roots do not
vouch for an internal product). Either way the chain and the host name are verified and
nothing older than TLS 1.2 is spoken.

Contexts are built on request and never cached here: whoever holds one (the dispatcher's
transport for one connection) decides how long it lives, and a rotated root is picked up
by building a new one.
"""

from __future__ import annotations

import ssl

from core.codes import Code
from core.config.model import Connection
from core.paths import key
from core.secrets import SecretError, SecretResolver


def product_ssl_context(pem: bytes | None) -> ssl.SSLContext:
    """A client context verifying chain and host name, at least TLS 1.2.

    ``pem`` None: the system default roots. Otherwise the PEM certificate(s) in ``pem`` are
    the only trusted roots. Raises ``ValueError`` (without the content) when ``pem`` holds no
    loadable PEM certificate.
    """
    cadata: str | None = None
    if pem is not None:
        try:
            cadata = pem.decode("ascii")
        except UnicodeDecodeError:
            raise ValueError("not PEM text") from None
        if "-----BEGIN CERTIFICATE-----" not in cadata:
            # cadata as text is read as PEM only; say so before OpenSSL's wording does.
            raise ValueError("holds no PEM certificate")
    try:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=cadata)
    except (ssl.SSLError, ValueError):
        raise ValueError("could not be loaded as PEM certificates") from None
    context.check_hostname = True
    context.verify_mode = ssl.CERT_REQUIRED
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def connection_ssl_context(connection: Connection, resolver: SecretResolver) -> ssl.SSLContext:
    """The context for ``connection``'s product, reading its ``trustedRootCertificateRef``.

    Refuses a root that does not load with ``secret.malformed``, naming the reference and
    the key path ``connections.<name>.trustedRootCertificateRef``, never the content.
    Reading the secret may refuse as any secret read does (``secret.unreadable``, ...).
    """
    ref = connection.trusted_root_certificate_ref
    if ref is None:
        return product_ssl_context(None)
    # PEM is text (CONTRACT §5): given through the environment it is the PEM itself, not
    # base64 of it as a binary secret would be.
    pem = resolver.read_text(ref).encode("utf-8")
    try:
        return product_ssl_context(pem)
    except ValueError as exc:
        path = key(key("connections", connection.name), "trustedRootCertificateRef")
        raise SecretError(Code.SECRET_MALFORMED, ref, f"{path}: {exc}") from None
