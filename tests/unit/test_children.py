"""Children started through ``die_with_parent`` stop when their parent is killed outright
(a SIGKILL, or a ``timeout`` ending a pytest run, runs no clean-up)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from app.runtime.children import die_with_parent

pytestmark = pytest.mark.skipif(shutil.which("setpriv") is None,
                                reason="util-linux's setpriv is not on PATH")

# The parent prints its child's pid, then waits to be killed.
_PARENT = """
import subprocess, sys, time
{setup}
print(pid, flush=True)
time.sleep(120)
"""


def _gone(pid: int, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            # a zombie (reaped by init soon) counts as gone: its state is Z
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(") ", 1)[1].startswith("Z"):
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def _orphan_after_kill(setup: str) -> int:
    parent = subprocess.Popen([sys.executable, "-c", _PARENT.format(setup=setup)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert not _gone(child, 0.3), "the child died before its parent"
    finally:
        parent.kill()
        parent.wait(timeout=10)
    return child


def _assert_stops(child: int, what: str) -> None:
    try:
        assert _gone(child), f"{what} {child} outlived the killed process that started it"
    finally:
        if not _gone(child, 0):
            os.kill(child, signal.SIGKILL)


def test_a_child_stops_when_its_parent_is_killed() -> None:
    child = _orphan_after_kill(
        "from app.runtime.children import die_with_parent\n"
        "p = subprocess.Popen(die_with_parent(['sleep', '60']), start_new_session=True)\n"
        "pid = p.pid")
    _assert_stops(child, "sleep")


def test_the_embedded_broker_stops_when_the_process_that_started_it_is_killed() -> None:
    child = _orphan_after_kill(
        "from app.kafka.embedded import EmbeddedBroker\n"
        "b = EmbeddedBroker().start()\n"
        "pid = b.pid")
    _assert_stops(child, "Tansu")


def test_the_command_is_unchanged_without_setpriv(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda _name: None)
    assert die_with_parent(["sleep", "1"]) == ["sleep", "1"]
