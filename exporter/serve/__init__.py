"""The exporter's HTTP edge: /metrics, the JSON API and the app that serves them."""
