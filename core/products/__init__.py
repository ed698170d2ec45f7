"""Talking to the other Registry Stack products as the coordinator's own clients.

The dispatcher sends commands and reads review results; recovery reads receipts. Both use
the same per-connection OAuth clients (:mod:`core.products.tokens`).
"""
