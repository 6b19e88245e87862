"""End-to-end tests of a rendered graph's data plane (see tests/support/e2e/sandbox.py)."""
