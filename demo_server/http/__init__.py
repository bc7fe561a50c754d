"""The demo server's HTTP edge: the OpenAI-style and embedding endpoints, /metrics, /health."""
