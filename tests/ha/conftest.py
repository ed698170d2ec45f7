"""The failover tier's one fixture: a synchronous Patroni pair with etcd, on hosts of its
own (tests/helpers/ha_cluster.py), made for each test and torn down after it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.helpers.ha_cluster import HaCluster, ha_cluster


@pytest.fixture
def cluster() -> Iterator[HaCluster]:
    with ha_cluster(synchronous=True) as made:
        yield made
