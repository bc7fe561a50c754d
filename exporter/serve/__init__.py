"""The exporter's HTTP edge: /metrics, the JSON API, the histories and the replica count kept between rounds."""
