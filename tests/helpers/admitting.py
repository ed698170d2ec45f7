"""What the admission tests share: an Admitter over a served admission store, and the
refusal a start is expected to meet."""

from __future__ import annotations

from typing import Any

import pytest

from admission.start import Admitter
from core.errors import CoordinatorError
from tests.helpers.serving import Served


def admitter(env: Served) -> Admitter:
    """The Admitter the admission component of ``env`` would build."""
    return Admitter.from_runtime(env.runtime, env.store("admission"))


async def refused(code: str, action: Any) -> CoordinatorError:
    """Await ``action`` and answer the CoordinatorError it raised, which must carry ``code``."""
    with pytest.raises(CoordinatorError) as caught:
        await action
    assert caught.value.code == code, caught.value
    return caught.value
