"""Fixtures every integration test module may ask for by name."""

from tests.helpers.pinned_clock import fake_clock

__all__ = ["fake_clock"]
