"""What the admission tests share: an Admitter over a served admission store, and the
refusal a start is expected to meet."""

from __future__ import annotations

from typing import Any

import pytest

from admission.start import Admitter
from core.callers import Caller
from core.errors import CoordinatorError
from core.runtime import Runtime, Store
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


async def admit(
    store: Store,
    runtime: Runtime,
    caller: Caller,
    workflow_id: str,
    key: str,
    input: Any,
) -> tuple[bool, str]:
    """Start a run outside gRPC, as the admission component does: ``(created, run_id)``.

    ``store`` must be an opened admission store; its activation is verified here if it was
    not yet.
    """
    if store.activation is None:
        await store.verify()
    result = await Admitter.from_runtime(runtime, store).start(caller, workflow_id, key, input)
    return result.created, result.run_id
