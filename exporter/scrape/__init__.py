"""Scraping targets: one scrape over aiohttp (fetch.py) and the loop over the fleet (loop.py)."""
