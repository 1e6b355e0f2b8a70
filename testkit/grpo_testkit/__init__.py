"""Helpers for tests and local demos: tiny real models built without network access."""
