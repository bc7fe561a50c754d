"""The benchmark scripts, run quick."""
