"""Step executors, one module per step type (CONTRACT §3, §9)."""
