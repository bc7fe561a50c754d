"""Helpers shared by tests: no test module imports another test module."""
