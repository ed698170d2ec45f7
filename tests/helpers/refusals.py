"""Reading coordinatorctl's refusals as a script would."""

from __future__ import annotations

import json
from typing import Any


def json_refusal(err: str) -> dict[str, Any]:
    """The JSON document of a refusal under --output json: the first line of standard error;
    the last line still starts with the code, as in text mode (CONTRACT §2.2)."""
    lines = err.splitlines()
    document: dict[str, Any] = json.loads(lines[0])
    assert lines[-1].startswith(document["code"] + ": "), lines[-1]
    return document
