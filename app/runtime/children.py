"""Child processes that do not outlive the process that started them."""

from __future__ import annotations

import shutil

__all__ = ["die_with_parent"]


def die_with_parent(cmd: list[str], signal_name: str = "TERM") -> list[str]:
    """``cmd`` run under util-linux's ``setpriv --pdeathsig``, so the kernel sends the
    child ``SIGTERM`` (by default) when its parent dies, however it dies; ``cmd`` as it is
    where ``setpriv`` is missing.

    Why: brokers and workers run in their own process group (so that a Ctrl-C aimed at the
    parent does not reach them before it stops them in order), and a parent killed with
    SIGKILL, or a pytest run a ``timeout`` ends, runs no clean-up: its children ran on,
    a broker and workers using more than a core. ``setpriv`` execs ``cmd``, so the
    child's pid is the command's own. The signal follows the death of the parent's
    *thread* that started it: start such children from a thread that lives as long as
    they should (every caller here starts them from the main thread).
    """
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", signal_name, *cmd] if setpriv else list(cmd)
