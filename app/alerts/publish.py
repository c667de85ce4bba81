"""Sending a batch's alerts to ``PREFIX.alerts`` and counting them (the feature agents' part).

Detection is :class:`app.alerts.detect.Detector` (pure); the skew comes from the
worker's :class:`app.runtime.skewboard.SkewBoard`. The feature agent calls
:meth:`AlertPublisher.sends` with a batch's outputs as soon as they exist and puts
the alerts' sends first in the batch's :func:`app.runtime.delivery.deliver`: they
are started before the feature records' (the alert waits for nothing downstream),
and, like them, confirmed by the broker (or sent again) before the batch is acked.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from app.alerts.detect import Detector, Thresholds
from app.features.text import TermMatcher
from app.runtime.delivery import Record, Send

if TYPE_CHECKING:
    from app.runtime.faust_app import Runtime

__all__ = ["AlertPublisher"]

log = logging.getLogger(__name__)


class AlertPublisher:
    def __init__(self, rt: Runtime) -> None:
        s = rt.settings
        ocr = None
        if s.alert_ocr_terms and s.ocr_every_n_frames:
            ocr = TermMatcher.from_files(s.terms_paths)  # the captions' lists
        self.detector = Detector(Thresholds.from_settings(s), s.topic, ocr,
                                 models=s.models == "full")
        self._board = rt.skew_board
        self._topic = rt.topics["alerts"]
        self._m = rt.metrics

    def sends(self, outs: list[Any], level: int, kinds: Collection[str] | None = None
              ) -> list[Send]:
        """Detect and count the alerts of one batch's outputs (feature records and dead
        letters, as ``FeaturePipeline.process`` returns them); their sends, keyed by
        stream_id. ``level``: the degradation level the batch ran at; ``kinds``: only
        these alert kinds (None: all; ``Detector.batch``)."""
        try:
            res = self.detector.batch(outs, self._board.view, level, kinds)
        except Exception:  # noqa: BLE001 - a detection bug must not stop the features
            log.exception("alert detection failed on a batch of %d: no alerts for it",
                          len(outs))
            return []
        m = self._m
        sends: list[Send] = []
        for a in res.alerts:
            sends.append(Record(self._topic, a.stream_id.encode(), a.encode()))
            m.alerts.labels(a.modality, a.kind).inc()
            if a.kind != "blind" and a.kafka_ts_ms > 0:
                # input record's Kafka timestamp to now, just before its send starts, s
                m.alert_latency.observe(max(0.0, time.time() - a.kafka_ts_ms / 1000))
        for reason, n in res.skipped.items():
            m.alert_skipped.labels("image", reason).inc(n)
        return sends
