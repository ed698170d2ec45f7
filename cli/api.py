"""The HTTP side of coordinatorctl: token files, references and calls to the gateway."""

from __future__ import annotations

import json
import os
import ssl
import stat
from pathlib import Path
from typing import Any

import httpx

from core.codes import Code
from core.errors import CoordinatorError
from core.runs import REFERENCE

TIMEOUT_SECONDS = 30.0


def client_tls() -> ssl.SSLContext:
    """The roots the gateway's certificate must chain to: those ``SSL_CERT_FILE`` or
    ``SSL_CERT_DIR`` name when set, else certifi's bundle.

    coordinatorctl's clients of the gateway (its API commands and the console) ignore proxy
    settings in the environment (``trust_env=False``): a variable the shell happens to carry
    must not decide where the operator's bearer token is sent. That switch drops these two
    variables as well; they are kept because they are how an operator trusts a gateway
    behind a private CA, and they send nothing anywhere.
    """
    return httpx.create_ssl_context(trust_env=True)


def check_reference(option: str, value: str) -> str:
    """Validate an investigation reference locally, before anything is sent."""
    if not REFERENCE.fullmatch(value):
        raise CoordinatorError(
            Code.REQUEST_INVALID,
            f"{option} must be 1-128 characters of letters, digits and . _ : / -",
        )
    return value


def read_token_file(path: Path) -> str:
    """Read a bearer token from an owner-only file; refuse loose permissions."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        reason = "does not exist" if isinstance(exc, FileNotFoundError) else "cannot be opened"
        raise CoordinatorError(Code.AUTH_TOKEN_FILE, f"{path}: token file {reason}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise CoordinatorError(Code.AUTH_TOKEN_FILE, f"{path}: not a regular file")
        if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise CoordinatorError(
                Code.AUTH_TOKEN_FILE,
                f"{path}: readable or writable by group or others; use chmod 600",
            )
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read(65537)
    finally:
        os.close(fd)
    try:
        token = data.decode("ascii")
    except UnicodeDecodeError:
        raise CoordinatorError(Code.AUTH_TOKEN_FILE, f"{path}: not an ASCII token") from None
    if token.endswith("\n"):
        token = token[:-1]
    if not token or len(data) > 65536:
        raise CoordinatorError(Code.AUTH_TOKEN_FILE, f"{path}: empty or oversized token file")
    return token


class ApiClient:
    """A small synchronous client of the gateway; problems become CoordinatorError."""

    def __init__(self, url: str, token: str) -> None:
        self._base = url.rstrip("/")
        self._token = token

    def request(
        self,
        method: str,
        path: str,
        *,
        body: dict[str, Any] | None = None,
        params: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
        timeout: float = TIMEOUT_SECONDS,
    ) -> Any:
        """Send one request; return the decoded JSON body of a 2xx answer."""
        all_headers = {"Authorization": f"Bearer {self._token}", "Accept": "application/json"}
        all_headers.update(headers or {})
        try:
            with httpx.Client(timeout=timeout, trust_env=False, verify=client_tls()) as client:
                response = client.request(
                    method, self._base + path, json=body, params=params, headers=all_headers
                )
        except httpx.HTTPError:
            raise CoordinatorError(
                Code.SERVICE_UNAVAILABLE, f"cannot reach the coordinator at {self._base}"
            ) from None
        try:
            document = response.json()
        except (ValueError, json.JSONDecodeError):
            document = None
        if 200 <= response.status_code < 300:
            return document
        # A problem with a code of ours is the refusal; anything else is an unexpected answer.
        text = document.get("code") if isinstance(document, dict) else None
        code = Code.parse(text) if isinstance(text, str) else None
        if code is not None:
            detail = document.get("detail") or document.get("title") or ""
            raise CoordinatorError(code, str(detail))
        raise CoordinatorError(
            Code.SERVICE_UNAVAILABLE, f"unexpected HTTP {response.status_code} from the coordinator"
        )
