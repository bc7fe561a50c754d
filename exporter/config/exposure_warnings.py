"""Warnings at start about what the configuration exposes: the exporter's own endpoints
beyond loopback without auth or TLS, and credentials sent to targets in clear text."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from urllib.parse import urlsplit

from batchscope.exporter.config.settings import Settings, Target


def is_loopback(host: str) -> bool:
    """Whether binding `host` keeps the endpoints on this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def exposure_warnings(settings: Settings, targets: Iterable[Target]) -> list[str]:
    """One plain sentence per exposure, for the log at start."""
    warnings = []
    host, port = settings.listen_host_port()
    token = settings.web_token_env is not None or settings.web_token_file is not None
    tls = settings.tls_cert_file is not None
    if not is_loopback(host) and not (token and tls):
        missing = " and ".join(
            what for what, given in (("a token", token), ("TLS", tls)) if not given
        )
        warnings.append(
            f"listening on {host}:{port}, beyond loopback, without {missing}: anyone who "
            "reaches this port reads every target's signals; set --web-token-env or "
            "--web-token-file and --tls-cert-file/--tls-key-file"
        )
    for target in targets:
        if target.auth is not None and urlsplit(target.url).scheme == "http":
            warnings.append(
                f"target {target.name}: its {target.auth.type} credentials go over plain "
                "http://, readable by anyone on the path; use https://"
            )
    return warnings
