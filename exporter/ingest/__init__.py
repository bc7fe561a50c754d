"""Reading /metrics payloads: the Prometheus text-format parser, one plain path."""
