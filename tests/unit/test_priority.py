"""The image threads' lower priority (app.runtime.priority): per thread, inherited."""

from __future__ import annotations

import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from app.runtime.priority import lower_this_thread

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="nice values per thread are Linux's")


def _nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def test_only_the_calling_thread_and_the_threads_it_starts_are_lowered() -> None:
    before = _nice()
    seen: dict[str, int] = {}

    def child() -> None:
        seen["child"] = _nice()

    def work() -> None:
        seen["set"] = lower_this_thread(5) or 0
        seen["self"] = _nice()
        with ThreadPoolExecutor(1) as side:  # as the image extractor starts its second thread
            side.submit(child).result()

    with ThreadPoolExecutor(1, initializer=work) as pool:
        pool.submit(lambda: None).result()
    want = min(19, before + 5)
    assert seen == {"set": want, "self": want, "child": want}
    assert _nice() == before  # the caller's (the event loop's) priority is untouched


def test_zero_changes_nothing() -> None:
    assert lower_this_thread(0) is None
