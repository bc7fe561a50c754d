"""The load generator: seeded workloads, runs against a server, and their reports."""
