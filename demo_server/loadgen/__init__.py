"""The load generator: random workloads (repeatable by `--seed`), runs against a server or
a fleet, and their reports."""
