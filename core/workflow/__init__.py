"""The workflow language: parse, check, package and verify (CONTRACT §3, §4)."""
