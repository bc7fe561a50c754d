"""The unit tier stays in process: a test of it that opens a network socket or starts a
subprocess (but promtool) fails, so `make test-fast` cannot grow slow or flaky unseen."""

from __future__ import annotations

import socket
import subprocess

import pytest

from tests.conftest import LeftTheUnitTier
from tests.support.system_tools import tool


def test_a_unit_test_cannot_connect_bind_or_start_a_process() -> None:
    with socket.socket() as sock, pytest.raises(LeftTheUnitTier, match="mark the test"):
        sock.connect(("127.0.0.1", 9))
    with socket.socket() as sock, pytest.raises(LeftTheUnitTier):
        sock.bind(("127.0.0.1", 0))
    with pytest.raises(LeftTheUnitTier, match="subprocess"):
        subprocess.run(["true"], check=True)
    # promtool's rule tests are the one subprocess the tier allows
    assert subprocess.run([tool("promtool"), "--version"], capture_output=True).returncode == 0


@pytest.mark.integration
def test_an_integration_test_may_open_a_socket() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        assert sock.getsockname()[1] > 0
