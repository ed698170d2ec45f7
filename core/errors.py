"""The one exception type that carries a catalogued code across every surface.

The CLI prints it as ``coordinator.<code>: <detail>``; the gateway turns it into an RFC 9457
problem; components carry it over gRPC. Nothing matches on message text, only on ``code``,
a :class:`core.codes.Code`. A detail names *what* is wrong (a key path, a JSON pointer, a
file) and never a secret, a token, an input value or personal data.
"""

from __future__ import annotations

from typing import Any

from core.codes import Code


class CoordinatorError(Exception):
    """A refusal with a stable code (for example ``config.invalid``) and a safe detail."""

    def __init__(self, code: Code, detail: str, extra: dict[str, Any] | None = None) -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail
        # Extra problem members that are safe to show, e.g. ``errors`` (JSON pointers).
        self.extra = extra or {}

    def cli_line(self) -> str:
        """The line coordinatorctl prints on standard error."""
        return f"coordinator.{self.code}: {self.detail}"


class ConfigInvalid(CoordinatorError):
    """A runtime file refusal; ``path`` is the dotted key path (``deployment.packages[3].root``)."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(Code.CONFIG_INVALID, f"{path}: {reason}" if path else reason)
        self.path = path
        self.reason = reason


class PackageInvalid(CoordinatorError):
    """A workflow source or package refusal; ``path`` names the key path or the file."""

    def __init__(self, path: str, reason: str, code: Code = Code.PACKAGE_INVALID) -> None:
        super().__init__(code, f"{path}: {reason}" if path else reason)
        self.path = path
        self.reason = reason
