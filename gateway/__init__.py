"""The public HTTP endpoint: token verification, authorization and the API routes."""
