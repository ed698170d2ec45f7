"""The audit journal's file, shared by auditd, which writes it, and coordinatorctl, which
verifies and seals it offline: the record format and the reading side (``format``), the
chain check (``verify``) and the repair of a torn last line (``seal``) (CONTRACT §12)."""
