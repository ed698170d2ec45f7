"""Benchmarks of the serving core (``make bench``); not tests, never collected by pytest."""
