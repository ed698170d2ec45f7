"""Requests to Casework (connection type ``casework-review-producer``).

A review request carries ``producer``: the key under the Casework project's
``trustedProducers``. It is a task authority, so it comes from the run's recorded binding
(the operator's runtime file), never from the workflow; the catalogue lists it among the
operation's connection fields and the shared builder fills it in.
"""

from __future__ import annotations

from core.execution.adapters.base import CatalogueAdapter

ADAPTER = CatalogueAdapter("casework-review-producer")
