"""Nothing secret in anything the tier showed (issue 27, item 7).

The tier's families keep, in :data:`tests.reliability.exposure.EXPOSURE`, the coordinator
logs, audit journals, problem documents and metrics pages they produced and every token,
key, secret file, database password and start-input value they used. This module runs last
(the tier's ``conftest`` orders it so) and looks for each secret in each output, as is and
in the encodings a careless log line would use. Run alone it has nothing to look at, and
says so by failing: the check is only meaningful after the families it reads.
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest

from tests.reliability.exposure import EXPOSURE, Exposure

ROOT = Path(__file__).resolve().parents[2]
FIGURES = ROOT / ".cache" / "reliability" / "secrets.json"


def test_no_secret_the_tier_used_appears_in_anything_it_showed() -> None:
    families = {label.split("/", 1)[0] for label in EXPOSURE.outputs}
    assert EXPOSURE.secrets and EXPOSURE.outputs, (
        "nothing was kept: run the whole tier (pytest tests/reliability), not this module alone"
    )
    found = EXPOSURE.findings()
    figures = {
        "secrets": len(EXPOSURE.secrets),
        "outputs": len(EXPOSURE.outputs),
        "outputBytes": sum(len(content) for content in EXPOSURE.outputs.values()),
        "families": sorted(families),
        "found": len(found),
    }
    FIGURES.parent.mkdir(parents=True, exist_ok=True)
    FIGURES.write_text(json.dumps(figures, indent=2) + "\n")
    print(f"\nsecrets grepped: {json.dumps(figures)}")
    # Name what leaked where, never the value.
    assert not found, [f"{secret} ({form}) in {output}" for secret, form, output in found]


# ---- the check itself can fail


@pytest.fixture
def planted() -> Exposure:
    exposure = Exposure()
    exposure.keep_secret(
        "stack/operator-token", "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJvcCJ9.c2lnbmF0dXJlLXBhcnQ"
    )
    exposure.keep_secret("stack/audit-key", os.urandom(32))
    exposure.keep_output("stack/coordinator.log", "gateway: started\n")
    return exposure


def test_a_clean_output_has_no_finding(planted: Exposure) -> None:
    assert planted.findings() == []


@pytest.mark.parametrize(
    ("secret", "encode", "form"),
    [
        ("stack/operator-token", lambda raw: raw, "as is"),
        ("stack/operator-token", lambda raw: raw.rsplit(b".", 1)[1], "JWT signature"),
        ("stack/audit-key", lambda raw: raw, "as is"),
        ("stack/audit-key", lambda raw: raw.hex().encode(), "hex"),
        ("stack/audit-key", lambda raw: base64.b64encode(raw), "base64"),
        ("stack/audit-key", lambda raw: base64.urlsafe_b64encode(raw).rstrip(b"="), "base64url"),
    ],
)
def test_a_secret_written_into_an_output_is_found_in_each_form(
    planted: Exposure, secret: str, encode: object, form: str
) -> None:
    assert callable(encode)
    planted.keep_output(
        "stack/coordinator.log", b"token=" + encode(planted.secrets[secret]) + b"\n"
    )
    assert (secret, form, "stack/coordinator.log") in planted.findings()


def test_a_secret_too_short_to_look_for_is_refused_when_kept() -> None:
    with pytest.raises(ValueError, match="too short"):
        Exposure().keep_secret("stack/pin", "1234")
