"""A local stack whose components talk gRPC over TCP with mutual TLS (the e2e tests' shape
of components on their own hosts)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from devstack.postgres_tls import CertificateAuthority
from devstack.stack import LocalStack
from tests.helpers.deployment import write_secret

TLS_REFS = {
    "certificateRef": "secret:file/internal.crt",
    "privateKeyRef": "secret:file/internal.key",
    "trustedRootCertificateRef": "secret:file/internal-ca.pem",
}


def use_internal_tls(
    stack: LocalStack, addresses: Mapping[str, str], **extra: Any
) -> CertificateAuthority:
    """Give ``stack`` a private CA and one certificate naming every host of ``addresses``
    (and 127.0.0.1), and set ``deployment.internal`` to those addresses with mutual TLS
    (plus ``extra`` keys, such as ``metricsPort``). Answers the CA."""
    authority = CertificateAuthority.create("internal channel CA")
    hosts = dict.fromkeys(["127.0.0.1", *(a.rpartition(":")[0] for a in addresses.values())])
    certificate, key = authority.issue_server(tuple(hosts), client_auth=True)
    secrets = stack.runtime_file.parent / "secrets"
    write_secret(secrets, "internal.crt", certificate)
    write_secret(secrets, "internal.key", key)
    write_secret(secrets, "internal-ca.pem", authority.pem)
    document: dict[str, Any] = yaml.safe_load(stack.runtime_file.read_text())
    document["deployment"]["internal"] = {"addresses": dict(addresses), "tls": TLS_REFS, **extra}
    stack.runtime_file.write_text(yaml.safe_dump(document, sort_keys=False))
    return authority
