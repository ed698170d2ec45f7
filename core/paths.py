"""Dotted key paths as every refusal prints them: ``a.b[3].c``."""

from __future__ import annotations


def key(parent: str, name: str) -> str:
    """Path of mapping key ``name`` under ``parent``."""
    return f"{parent}.{name}" if parent else name


def index(parent: str, position: int) -> str:
    """Path of list position ``position`` under ``parent``."""
    return f"{parent}[{position}]"
