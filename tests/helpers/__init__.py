"""Helpers shared by the test tiers."""
