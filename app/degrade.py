"""Graceful degradation: fewer model runs while records wait too long (pure).

The signal is queueing delay: how long the oldest record of a batch waited
between its Kafka timestamp (when the producer sent it) and the moment its
batch starts. A worker that keeps up sees tens of milliseconds; one that
falls behind sees it grow without bound. Above ``lag_s`` the level goes up
one step (at most once per ``hold_s``); below a quarter of it for
``calm_s`` it comes down one step. Nothing is dropped at any level: every
record still gets its light signals and goes through the aligner; only the
expensive model features are sampled.

| level | image models (EfficientNet, NSFW) | OCR | text embedding |
|---|---|---|---|
| 0 | every new frame | every Nth frame | on |
| 1 | every 2nd new frame of a stream; the rest hold the last result | every 2Nth | on |
| 2 | every 4th | off | off |
| 3 | off (light signals only) | off | off |
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LEVELS", "Degrader", "Level"]


@dataclass(frozen=True, slots=True)
class Level:
    #: run the image models on one new frame in this many per stream; 0: never
    image_every: int
    ocr: bool
    text_embedding: bool


LEVELS: tuple[Level, ...] = (
    Level(1, True, True),
    Level(2, True, True),
    Level(4, False, False),
    Level(0, False, False),
)


class Degrader:
    """Chooses the level from the queueing delay of each batch."""

    def __init__(self, lag_s: float = 1.0, hold_s: float = 2.0, calm_s: float = 5.0,
                 enabled: bool = True) -> None:
        self.lag_s, self.hold_s, self.calm_s = lag_s, hold_s, calm_s
        self.enabled = enabled
        self.level = 0
        self._changed = float("-inf")
        self._calm_since: float | None = None

    @property
    def current(self) -> Level:
        return LEVELS[self.level]

    def observe(self, delay_s: float, now: float) -> int:
        """Record one batch's queueing delay (s) at monotonic time ``now``; the level."""
        if not self.enabled:
            return 0
        if delay_s > self.lag_s:
            self._calm_since = None
            if self.level < len(LEVELS) - 1 and now - self._changed >= self.hold_s:
                self.level += 1
                self._changed = now
        elif delay_s < self.lag_s / 4:
            if self._calm_since is None:
                self._calm_since = now
            if self.level > 0 and now - max(self._calm_since, self._changed) >= self.calm_s:
                self.level -= 1
                self._changed = now
                self._calm_since = now
        else:
            self._calm_since = None
        return self.level
