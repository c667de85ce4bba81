"""When a worker is ready: its models loaded, then its first partitions taken.

Start-up is one ordered path (``app.runtime.process.run_worker``): the models are
loaded (built the first time) before the Faust worker subscribes, so a worker
never owns partitions it cannot serve. Ready means both that and a finished
first assignment (possibly of no partition, when there are more workers than
partitions): ``mmsync_ready`` says 1 and ``GET /ready`` answers 200, else 503
with what is still missing. While the models load, the web port is not open
yet: a readiness probe reads that as "not ready" too.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from prometheus_client import Gauge

__all__ = ["Readiness"]

log = logging.getLogger("mmsync")


@dataclass
class Readiness:
    gauge: Gauge
    started: float = field(default_factory=time.monotonic)
    models_loaded: bool = False
    assigned: bool = False
    _announced: bool = False

    def __post_init__(self) -> None:
        self.gauge.set(0)

    @property
    def ready(self) -> bool:
        return self.models_loaded and self.assigned

    def missing(self) -> str:
        """What the worker still waits for, in words ('' when ready)."""
        if not self.models_loaded:
            return "loading models"
        if not self.assigned:
            return "waiting for its partitions"
        return ""

    def loaded(self) -> None:
        self.models_loaded = True
        self._update()

    def on_assigned(self) -> None:
        self.assigned = True
        self._update()

    def _update(self) -> None:
        if self.ready and not self._announced:
            self._announced = True
            self.gauge.set(1)
            log.info("worker ready %.1f s after start (models loaded, partitions assigned)",
                     time.monotonic() - self.started)
