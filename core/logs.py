"""How every component writes its log: level, format and the lines every operator expects.

A component logs to standard error, one record per line, each with an ISO 8601 UTC time and
the component's name, so one journal or one container log can hold all five components.
``text`` is for people; ``json`` (one object per line, through python-json-logger) is for
log shippers. Levels, most to least talkative: ``debug``, ``info`` (each step transition),
``notice`` (the default: starts, stops, and every warning) and ``warning``, ``error``.

Nothing logged here or by callers carries a token, secret, input value or personal data:
records name runs, steps, connections and codes, never payloads.
"""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime
from typing import Final, TextIO

from pythonjsonlogger.json import JsonFormatter

NOTICE: Final = 25
"""Between INFO and WARNING: what a quiet service still says (starting, serving, stopping)."""
logging.addLevelName(NOTICE, "NOTICE")

LEVELS: Final = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "notice": NOTICE,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}
DEFAULT_LEVEL: Final = "notice"
DEFAULT_FORMAT: Final = "text"

log = logging.getLogger("coordinator")

# Libraries that are chatty below WARNING whatever level our operators ask for: their
# lines name loops, sockets and URLs, never what a run did. asyncpg's pool logs a warning
# with a traceback each time it fails to reconnect its floor of connections; while the
# database is away the store's rate-limited store-unavailable line is the one report. Our
# own "serving on" lines say what uvicorn's start and stop lines would.
_QUIETER: Final = {
    "asyncpg.pool": logging.ERROR,
    "asyncio": logging.WARNING,
    "grpc": logging.WARNING,
    "uvicorn": logging.WARNING,
    "httpx": logging.WARNING,
    "httpcore": logging.WARNING,
}


def iso_time(created: float) -> str:
    """``created`` (seconds since the epoch) as ``2026-12-05T06:30:00.123Z``."""
    moment = datetime.fromtimestamp(created, UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class _TextFormatter(logging.Formatter):
    def __init__(self, component: str) -> None:
        super().__init__(f"%(asctime)s {component} %(levelname)s %(name)s: %(message)s")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return iso_time(record.created)


class _JsonFormatter(JsonFormatter):
    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return iso_time(record.created)


def _formatter(component: str, form: str) -> logging.Formatter:
    if form == "json":
        return _JsonFormatter(
            ["asctime", "levelname", "name", "message"],
            rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
            static_fields={"component": component},
        )
    return _TextFormatter(component)


_json = False


def json_format() -> bool:
    """Whether records are written as JSON lines (the last :func:`configure` said so)."""
    return _json


def configure(
    component: str,
    level: str = DEFAULT_LEVEL,
    form: str = DEFAULT_FORMAT,
    stream: TextIO | None = None,
) -> None:
    """Send every record at ``level`` or above to ``stream`` (standard error) as ``form``.

    Called once before the runtime file is read (with the launcher's ``--log-level`` or the
    default) and again with the file's ``deployment.logging``; each call replaces the last.
    """
    global _json
    _json = form == "json"
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(_formatter(component, form))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(LEVELS[level])
    for name, floor in _QUIETER.items():
        logging.getLogger(name).setLevel(max(floor, LEVELS[level]))


def serving(component: str, where: str) -> None:
    """The one line each component writes once it answers: where it can be reached."""
    log.log(NOTICE, "%s serving on %s", component, where)


def internal_address(address: str) -> str:
    """How an internal gRPC address is shown: the socket path, or host:port with mTLS."""
    if address.startswith("unix:"):
        return address[len("unix:") :]
    return f"{address} (gRPC, mutual TLS)"
