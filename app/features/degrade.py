"""Graceful degradation: fewer model runs while records wait too long (pure).

The signal is queueing delay: how long the oldest record of a batch waited
between its Kafka timestamp (when the producer sent it) and the moment its
batch starts, or, when longer, the delay the records already waiting behind the
batch will reach (their count times the recent seconds per record:
``FeaturePipeline._degrade``), so a burst is met when it arrives, not once its
records are ``lag_s`` old (issue 26). A worker that keeps up sees tens of
milliseconds; one that falls behind sees it grow without bound. A batch over ``lag_s`` raises the
level (at most once per ``hold_s``): one step, or straight to the first level
whose share of the image models' work is at most ``lag_s / delay`` when the
delay is several times the bound (a 4 s backlog against a 1 s bound calls for
a quarter of the work now, not three steps 2 s apart: issue 26). The jump stops at the
last level that still samples (2): one late batch (a burst published at once, a worker that
waited for its models) never blinds the image models; "off" comes only from a further rise,
``hold_s`` later, with the delay still over the bound. Every ``calm_s`` without such a
batch lowers it one step, whether batches come or not (an idle worker is
back at 0 within ``3 x calm_s``). Under a steady overload this settles into
a cycle around the lowest level that keeps up. Nothing is dropped at any
level: every record still gets its light signals and goes through the
aligner; only the expensive model features are sampled.

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


def _share(level: Level) -> float:
    """The share of new frames the image models run on at ``level``."""
    return 1.0 / level.image_every if level.image_every else 0.0


#: the highest level one jump reaches: the last that still runs the image models
_JUMP_TOP = max(k for k, lv in enumerate(LEVELS) if lv.image_every)


def _called_for(delay_s: float, lag_s: float) -> int:
    """The lowest level whose image-model share is at most ``lag_s / delay_s``, at most
    ``_JUMP_TOP`` (a share of 0 is never called for by one batch)."""
    want = lag_s / delay_s
    return min(_JUMP_TOP, next(k for k, lv in enumerate(LEVELS) if _share(lv) <= want + 1e-9))


class Degrader:
    """Chooses the level from the queueing delay of each batch (times: monotonic s)."""

    def __init__(self, lag_s: float = 1.0, hold_s: float = 2.0, calm_s: float = 3.0,
                 enabled: bool = True) -> None:
        self.lag_s, self.hold_s, self.calm_s = lag_s, hold_s, calm_s
        self.enabled = enabled
        self.level = 0
        self._up = float("-inf")  # when the level last went up
        self._over = float("-inf")  # when a batch was last over the bound
        self._down = float("-inf")  # when the level last came down

    @property
    def current(self) -> Level:
        return LEVELS[self.level]

    def at(self, now: float) -> int:
        """The level at ``now``: one step down per ``calm_s`` since the last over-bound
        batch (or the last step down), with or without new batches."""
        if self.level:
            since = now - max(self._over, self._down)
            steps = int(since // self.calm_s) if since > 0 else 0
            if steps:
                self.level = max(0, self.level - steps)
                self._down = now
        return self.level

    def observe(self, delay_s: float, now: float) -> int:
        """Record one batch's queueing delay (s) at ``now``; returns the level."""
        if not self.enabled:
            return 0
        self.at(now)
        if delay_s > self.lag_s:
            self._over = now
            if self.level < len(LEVELS) - 1 and now - self._up >= self.hold_s:
                self.level = max(self.level + 1, _called_for(delay_s, self.lag_s))
                self._up = now
        return self.level
