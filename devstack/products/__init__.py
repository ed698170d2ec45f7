"""Stand-ins for the Registry Stack products the coordinator calls (CONTRACT §14).

Each stand-in is one small ASGI application that behaves like the product's public API as
far as the coordinator can see: it verifies the coordinator's access tokens, keeps
idempotency records (and, for Messaging and Scheduling, receipts), and answers with RFC 9457
problems. Dev-only routes under ``/dev/`` let tests and the quickstart read counters, inject
faults, move the stand-in's clock and, for Casework, record a reviewer's decision.

- :mod:`devstack.products.messaging` — send-notice and receipts
- :mod:`devstack.products.scheduling` — book-slot and receipts
- :mod:`devstack.products.breg` — submit-action and create-proposal
- :mod:`devstack.products.casework` — review requests, decisions and completion events

State is kept in memory: these are test doubles, not products.
"""
