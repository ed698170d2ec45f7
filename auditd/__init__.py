"""The audit component: owns the hash-chained audit journal (CONTRACT §12)."""
