"""Scraping targets: the HTTP client, one scrape, the loop over the fleet, the GC policy."""
