"""Debian's Chromium as the browser tests start it through playwright (never
`playwright install`)."""

from __future__ import annotations

EXECUTABLE = "/usr/bin/chromium"
ARGS = [
    "--no-sandbox",
    "--headless",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
