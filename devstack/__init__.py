"""Local stand-ins and the PostgreSQL harness behind tests, `make quickstart` and `make up`."""
