"""The log format every component writes (core.logs)."""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Iterator

import pytest

from core import logs
from core.runtime import raw

TEXT_LINE = re.compile(
    r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z dispatcher (NOTICE|WARNING|INFO) coordinator\.x: "
)


@pytest.fixture
def stream() -> Iterator[io.StringIO]:
    root = logging.getLogger()
    kept = (list(root.handlers), root.level)
    out = io.StringIO()
    try:
        yield out
    finally:
        logs.configure("test", "warning", "text", io.StringIO())
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in kept[0]:
            root.addHandler(handler)
        root.setLevel(kept[1])


def test_text_lines_carry_utc_time_component_and_level(stream: io.StringIO) -> None:
    logs.configure("dispatcher", "notice", "text", stream)
    log = logging.getLogger("coordinator.x")
    log.info("step transition")
    log.log(logs.NOTICE, "serving on %s", "/run/x.sock")
    log.warning("uncertain: %s", "timeout")
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2  # info is below the default level
    assert all(TEXT_LINE.match(line) for line in lines)
    assert lines[0].endswith("NOTICE coordinator.x: serving on /run/x.sock")


def test_info_shows_what_notice_hides(stream: io.StringIO) -> None:
    logs.configure("dispatcher", "info", "text", stream)
    logging.getLogger("coordinator.x").info("run r step s: prepared")
    assert stream.getvalue().rstrip().endswith("INFO coordinator.x: run r step s: prepared")


def test_json_lines_parse_one_by_one(stream: io.StringIO) -> None:
    logs.configure("gateway", "info", "json", stream)
    logging.getLogger("coordinator.x").info("a %s line", "first")
    logs.serving("gateway", "http://10.0.0.5:8108")
    raw("store-unavailable", "gateway: the database cannot be reached")
    records = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [r["message"] for r in records] == [
        "a first line",
        "gateway serving on http://10.0.0.5:8108",
        "store-unavailable: gateway: the database cannot be reached",
    ]
    assert [r["level"] for r in records] == ["INFO", "NOTICE", "WARNING"]
    assert {r["component"] for r in records} == {"gateway"}
    assert all(r["time"].endswith("Z") for r in records)


def test_libraries_stay_quiet_even_at_debug(stream: io.StringIO) -> None:
    logs.configure("gateway", "debug", "text", stream)
    logging.getLogger("httpx").info("HTTP Request: GET https://issuer.example.org/jwks")
    logging.getLogger("grpc._cython.cygrpc").debug("loop")
    logging.getLogger("coordinator.x").debug("ours")
    assert stream.getvalue().count("\n") == 1
    assert "ours" in stream.getvalue()


def test_a_raw_code_line_stays_plain_in_text_format(
    stream: io.StringIO, capsys: pytest.CaptureFixture[str]
) -> None:
    logs.configure("gateway", "notice", "text", stream)
    raw("store-unavailable", "gateway: the database cannot be reached")
    assert capsys.readouterr().err == "store-unavailable: gateway: the database cannot be reached\n"


def test_an_internal_address_is_shown_as_a_path_or_an_mtls_port() -> None:
    assert logs.internal_address("unix:/run/rc/admission.sock") == "/run/rc/admission.sock"
    assert logs.internal_address("10.0.0.5:7101") == "10.0.0.5:7101 (gRPC, mutual TLS)"
