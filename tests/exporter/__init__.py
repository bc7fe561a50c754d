"""The exporter: its math, parser, engines, configuration, scrape loop, server and alerts."""
