"""The image models' threads at a lower CPU priority than the rest of the worker (issue 26).

On a small box the image models take every core they are given, and a caption's alert
(a term match: no model) or a sound chunk then waits for a core behind them. Linux
keeps a nice value per thread, and a thread starts with its creator's: raised on the
image thread before its models load, it also holds for the thread the image extractor
starts for its second half-batch and for ONNX Runtime's intra-op threads, which a
session starts when it is made. Nothing is taken from the image models while a core
is free (the scheduler shares a busy core by weight: nice 10 gets about a tenth of
what nice 0 gets), so they still use every idle cycle.
"""

from __future__ import annotations

import logging
import os
import threading

__all__ = ["lower_this_thread"]

log = logging.getLogger(__name__)

#: the lowest priority a nice value names
_NICEST = 19


def lower_this_thread(by: int) -> int | None:
    """Raise the calling thread's nice value by ``by`` (capped at 19; only raised, as an
    unprivileged process may); the new value, or None where the platform keeps no nice
    value per thread (macOS, Windows: there the call changes nothing) or refused."""
    if by <= 0:
        return None
    if not hasattr(os, "setpriority") or not os.path.isdir("/proc/self/task"):
        log.info("thread priorities: not supported here, left as they are")
        return None
    tid = threading.get_native_id()
    try:
        now = os.getpriority(os.PRIO_PROCESS, tid)  # Linux: PRIO_PROCESS of a tid is the thread
        target = min(_NICEST, now + by)
        if target != now:
            os.setpriority(os.PRIO_PROCESS, tid, target)
        return target
    except OSError as exc:  # a sandbox that forbids it: run at the worker's priority
        log.warning("thread priority of %s not lowered: %s", threading.current_thread().name,
                    exc)
        return None
