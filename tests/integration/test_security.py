"""A running worker's metrics server answers on loopback only (the default)."""

from __future__ import annotations

import socket

import pytest

pytestmark = pytest.mark.integration


def _non_loopback_ipv4() -> str | None:
    """An address of this machine that is not loopback, if it has one (no packet sent)."""
    candidates: set[str] = set()
    for probe in ("10.255.255.255", "192.0.2.1"):
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((probe, 9))  # UDP connect only picks a route
                candidates.add(s.getsockname()[0])
        except OSError:
            pass
    try:
        candidates.update(socket.gethostbyname_ex(socket.gethostname())[2])
    except OSError:
        pass
    for a in sorted(candidates):
        if a.startswith("127.") or a == "0.0.0.0":  # noqa: S104
            continue
        try:  # binding proves the address is this machine's
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind((a, 0))
            return a
        except OSError:
            continue
    return None


async def test_metrics_not_reachable_off_loopback(pipeline):
    addr = _non_loopback_ipv4()
    if addr is None:
        pytest.skip("this machine has no non-loopback IPv4 address")
    env = {k: v for k, v in pipeline.env.items() if k != "MMSYNC_WEB_HOST"}
    pipeline.env = env
    worker = pipeline.start_worker(MMSYNC_MODELS="light", MMSYNC_AGENTS="aligner")
    text = pipeline.metrics(worker, timeout_s=60)  # up on loopback
    assert "mmsync_events_total" in text or "mmsync_windows_total" in text
    port = worker.web_port
    with pytest.raises(OSError):
        socket.create_connection((addr, port), timeout=2).close()
    print(f"\nmetrics on 127.0.0.1:{port} answer; {addr}:{port} refuses")
