"""The deploy tests' engine and images, made once per session (devstack/containers.py).

They need root, Debian's docker.io and debootstrap, and the wheel and lock files in dist/:
`make deploy-test` (a step of `.ci/run`; `make test` leaves this tier out) provides all of
them. Without them every test here fails with the one line that says what to run: none is
skipped.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from devstack.containers import (
    BASE_IMAGE,
    Engine,
    HostError,
    base_image,
    compose_binary,
    coordinator_image,
    install_host_packages,
    postgres_image,
)


@dataclass
class Images:
    """The engine and how long each image took to build this session."""

    engine: Engine
    seconds: dict[str, float] = field(default_factory=dict)


@pytest.fixture(scope="session")
def images() -> Iterator[Images]:
    try:
        install_host_packages()
        compose_binary()
        engine = Engine()
        was_running = engine.answers()
        engine.start()
    except HostError as exc:
        pytest.fail(str(exc), pytrace=False)
    built = Images(engine)
    try:
        import time

        started = time.monotonic()
        base_image(engine)
        built.seconds[BASE_IMAGE] = time.monotonic() - started
        built.seconds["postgres"] = postgres_image(engine)
        built.seconds["coordinator"] = coordinator_image(engine)
    except HostError as exc:
        pytest.fail(str(exc), pytrace=False)
    print(
        "\ndeploy images built: "
        + ", ".join(f"{name} {seconds:.1f} s" for name, seconds in built.seconds.items())
    )
    yield built
    if not was_running:
        engine.stop()
