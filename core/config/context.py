"""What a reading of a runtime file carries from one section's reader to the next: the
refusals found so far, what loaded, the file's folder and its secret providers. The readers
of each block (:mod:`core.config.load`, :mod:`core.config.connections`) share it; it lives
here so that neither imports the other for it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from core.config.model import (
    Connection,
    EventSource,
    PackagePin,
    Policy,
    RuntimeConfig,
    SecretProviders,
)
from core.yamlsafe import Problems


@dataclass
class Loaded:
    """What of a runtime file could be read, for the checks that join it with its packages.

    Filled while the file is read, so those checks can run on the parts that loaded even
    when other parts were refused. ``connections`` is None when the block could not be read
    at all; ``unreadable_connections`` names entries that were refused (no rule about them
    is judged against the packages).
    """

    pins: tuple[PackagePin, ...] | None = None
    connections: dict[str, Connection] | None = field(default_factory=dict)
    unreadable_connections: set[str] = field(default_factory=set)
    policies: dict[str, Policy] = field(default_factory=dict)
    event_sources: dict[str, EventSource] = field(default_factory=dict)

    @classmethod
    def of(cls, config: RuntimeConfig) -> Loaded:
        """Everything of a file that loaded whole."""
        return cls(
            pins=config.deployment.packages,
            connections=dict(config.connections),
            policies=dict(config.deployment.authentication.policies),
            event_sources=dict(config.event_sources),
        )


@dataclass
class Context:
    problems: Problems
    loaded: Loaded
    base: Path
    providers: SecretProviders | None = None
    """None until read, and when refused: then references are judged by form only."""
