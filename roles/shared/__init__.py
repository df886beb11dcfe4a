"""Helpers the roles share, each named for what it serves; they import the site model and
pyinfra at most, never a role (tests/unit/test_layout.py checks it)."""
