"""The reliability tier: the coordinator attacked and crashed the way production will (issue 27)."""
