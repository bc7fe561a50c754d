"""Reading /metrics payloads: the text-format parser and the compiled reads that make it fast."""
