"""Fixtures of the reliability tier.

OpenID provider: ``oidc_provider_modules`` installs the pinned ``oidc-provider`` once per
session (a no-op after ``make oidc-provider``); ``oidc_providers`` starts providers for a
module and stops every one of them afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from devstack.oidc_provider import OidcProviders, ensure_installed


@pytest.fixture(scope="session")
def oidc_provider_modules() -> Path:
    """The ``node_modules`` of the pinned ``oidc-provider`` (installed here if missing)."""
    return ensure_installed()


@pytest.fixture(scope="module")
def oidc_providers(oidc_provider_modules: Path) -> Iterator[OidcProviders]:
    """Start providers with ``oidc_providers.start(...)``; all stop after the module."""
    providers = OidcProviders(oidc_provider_modules)
    try:
        yield providers
    finally:
        providers.stop_all()


LAST_MODULE = "test_zz_nothing_secret.py"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The secrets check reads what every other test of the session kept: it runs last."""
    last = [item for item in items if item.path.name == LAST_MODULE]
    if last:
        items[:] = [item for item in items if item.path.name != LAST_MODULE] + last
