"""What the reliability tier produced, and what none of it may show (issue 27, item 7).

Every family of the tier keeps, while its stack still exists, what it showed to the world —
the coordinator's logs, the audit journal, problem documents, metrics pages — with
``keep_output``/``keep_stack``, and every secret it used — tokens, keys, secret files, the
database passwords, start-input values — with ``keep_secret``/``keep_stack``. The tier's last
test (``test_zz_nothing_secret.py``, ordered last by the tier's ``conftest``) looks for every
secret in every output, in the forms a careless log would write it: as is, hex, base64, and
for a JWT its signature alone.

The products' stand-ins' logs are not ours and are not kept: they log what a product would.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx

MIN_SECRET_BYTES = 8
"""A shorter value would match by chance; every secret the tier makes is longer."""


class _Database(Protocol):
    @property
    def migration_password(self) -> str: ...
    @property
    def runtime_password(self) -> str: ...


class _Local(Protocol):
    @property
    def root(self) -> Path: ...
    @property
    def logs(self) -> Path: ...
    @property
    def runtime_file(self) -> Path: ...


class _Stack(Protocol):
    local: Any
    database: Any
    producer_token: str
    operator_token: str
    admission_key: bytes
    audit_key: bytes


@dataclass
class Exposure:
    """The session's kept secrets and outputs."""

    secrets: dict[str, bytes] = field(default_factory=dict)
    outputs: dict[str, bytes] = field(default_factory=dict)

    def keep_secret(self, label: str, value: str | bytes) -> None:
        raw = value.encode("utf-8") if isinstance(value, str) else value
        raw = raw.strip()
        if len(raw) < MIN_SECRET_BYTES:
            raise ValueError(f"secret {label!r} is too short to look for ({len(raw)} bytes)")
        self.secrets[label] = raw

    def keep_output(self, label: str, content: str | bytes) -> None:
        raw = content.encode("utf-8", "surrogatepass") if isinstance(content, str) else content
        self.outputs[label] = self.outputs.get(label, b"") + raw

    def keep_response(self, label: str, response: httpx.Response) -> None:
        """An answer as a client saw it: status line, headers and body."""
        head = "".join(f"{name}: {value}\n" for name, value in response.headers.items())
        self.keep_output(label, f"{response.status_code}\n{head}\n".encode() + response.content)

    def keep_logs(self, label: str, local: _Local) -> None:
        """The coordinator's logs and audit journal under a local stack (not the stand-ins')."""
        for path in sorted(local.logs.glob("coordinator*.log")):
            self.keep_output(f"{label}/{path.name}", path.read_bytes())
        for path in sorted(local.root.rglob("*.jsonl")):
            if path.is_file():
                self.keep_output(f"{label}/{path.relative_to(local.root)}", path.read_bytes())

    def keep_secret_files(self, label: str, local: _Local) -> None:
        """The content of every secret file of the stack's deployment."""
        for folder in (local.runtime_file.parent / "secrets", local.root / "db-secrets"):
            if not folder.is_dir():
                continue
            for path in sorted(folder.iterdir()):
                if path.is_file() and path.stat().st_size >= MIN_SECRET_BYTES:
                    self.keep_secret(f"{label}/{path.name}", path.read_bytes())

    def keep_stack(self, label: str, stack: _Stack) -> None:
        """Everything a fault-kit stack used and showed; call before it is torn down."""
        self.keep_secret(f"{label}/producer-token", stack.producer_token)
        self.keep_secret(f"{label}/operator-token", stack.operator_token)
        self.keep_secret(f"{label}/admission-key", stack.admission_key)
        self.keep_secret(f"{label}/audit-key", stack.audit_key)
        self.keep_database(label, stack.database)
        self.keep_secret_files(label, stack.local)
        self.keep_logs(label, stack.local)

    def keep_database(self, label: str, database: _Database) -> None:
        self.keep_secret(f"{label}/migration-password", database.migration_password)
        self.keep_secret(f"{label}/runtime-password", database.runtime_password)

    def findings(self) -> list[tuple[str, str, str]]:
        """``(secret, form, output)`` for every secret found in an output."""
        found: list[tuple[str, str, str]] = []
        for secret, value in self.secrets.items():
            for form, needle in _forms(value):
                for output, content in self.outputs.items():
                    if needle in content:
                        found.append((secret, form, output))
        return found


def _forms(value: bytes) -> list[tuple[str, bytes]]:
    """The ways a log could carry ``value``."""
    forms = [("as is", value)]
    if value.count(b".") == 2 and value.startswith(b"eyJ"):
        signature = value.rsplit(b".", 1)[1]
        if len(signature) >= MIN_SECRET_BYTES:
            forms.append(("JWT signature", signature))
    forms.append(("hex", binascii.hexlify(value)))
    forms.append(("base64", base64.b64encode(value).rstrip(b"=")))
    forms.append(("base64url", base64.urlsafe_b64encode(value).rstrip(b"=")))
    return forms


EXPOSURE = Exposure()
"""The one registry of the test session."""
