"""Moderation alerts of a batch of feature records (pure: no Faust, no broker).

What alerts (docs/contract.md, "Alert"; thresholds are settings):

- ``nsfw``: a frame whose Open-NSFW score is at least ``MMSYNC_ALERT_NSFW``;
- ``term``: a caption in which the text extractor matched sensitive terms;
- ``ocr_term``: a frame whose OCR text (only frames OCR ran on, one in
  ``MMSYNC_OCR_EVERY_N_FRAMES``) holds sensitive terms, matched by the same
  :class:`app.features.text.TermMatcher` lists as captions;
- ``blind``: one per stream per batch in which frames went unscored because the
  image models were sampled or off under load (``app.features.degrade``): how many,
  which, the time they span and the level, so a moderator knows when nobody looked.

A frame that was not scored never raises ``nsfw`` or ``ocr_term``: it is reported as
blind instead. Unscored means ``held`` (it carries its stream's last score, not its
own: ``sampled``), or no score at all while the models are on (``off``: no image model
ran on this picture, at level 3 or as a near-duplicate of a frame that came then).

Time. ``ts`` is the input's ``ts`` minus its modality's skew offset as the aligner
last published it (:class:`SkewView`, from ``app.runtime.skewboard``); the image
is the reference clock, so a frame's ``ts`` is its own. ``window_id`` is the window
that holds ``ts`` with the aligner's bucketing, ``floor(ts / W) * W``: the window the
input lands in unless the estimate moves before the window closes, or the window
already closed (the input is late).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

from app.settings import Settings
from schemas.alert import Alert, Source
from schemas.aligned import window_id
from schemas.features import FeatureRecord

__all__ = ["LATE_KINDS", "SCORE_KINDS", "BatchAlerts", "Detector", "SkewView", "Thresholds",
           "window_start"]

#: A frame's alert kinds decided by its NSFW score alone (sent before its embedding and
#: OCR exist), and the one that needs its OCR text (sent with its features).
SCORE_KINDS = frozenset({"nsfw", "blind"})
LATE_KINDS = frozenset({"ocr_term"})
#: Characters of OCR text an ``ocr_term`` alert carries in its detail.
_OCR_DETAIL_CHARS = 200


def _trace_id(rec: FeatureRecord) -> str:
    """The input's trace id, or the one the pipeline assigns at ingest."""
    return rec.trace_id or f"{rec.modality}-{rec.src_partition}-{rec.src_offset}"


def window_start(ts_ref: int, window_us: int) -> int:
    """Start of the aligner's window holding ``ts_ref`` (reference clock), us."""
    return max(0, ts_ref) // window_us * window_us


@dataclass(frozen=True, slots=True)
class Thresholds:
    nsfw: float = 0.8
    terms: bool = True
    ocr_terms: bool = True

    @classmethod
    def from_settings(cls, s: Settings) -> Thresholds:
        return cls(nsfw=s.alert_nsfw, terms=s.alert_terms, ocr_terms=s.alert_ocr_terms)


@dataclass(frozen=True, slots=True)
class SkewView:
    """What the alert of one input uses of its stream's skew estimate."""

    #: the modality's lag behind the reference, us (0: none known)
    offset_us: int = 0
    #: 0..1; 0: no estimate known (offset 0 applied)
    confidence: float = 0.0
    #: the aligner's window, us
    window_us: int = 1_000_000


@dataclass(slots=True)
class BatchAlerts:
    alerts: list[Alert] = field(default_factory=list)
    #: frames left unscored, by reason: ``sampled`` (the models ran on other frames of
    #: the stream) or ``off`` (no image model ran at all)
    skipped: dict[str, int] = field(default_factory=dict)


class Detector:
    """Turns feature records into alerts. ``topic_of(modality)`` names an input topic;
    ``ocr_terms`` matches terms in OCR text (None: no ``ocr_term`` alerts); ``models``:
    the image models are on (``MMSYNC_MODELS=full``), so a frame without a score went
    unscored (with the light profile no frame has one, and none is reported blind)."""

    def __init__(self, th: Thresholds, topic_of: Callable[[str], str],
                 ocr_terms: Callable[[str], list[str]] | None = None,
                 clock_us: Callable[[], int] | None = None, models: bool = True) -> None:
        self.th = th
        self.models = models
        self._topic_of = topic_of
        self._ocr_terms = ocr_terms
        self._clock_us = clock_us or (lambda: time.time_ns() // 1000)

    def _alert(self, rec: FeatureRecord, kind: str, score: float, detail: dict[str, Any],
               skew: SkewView) -> Alert:
        ts = max(0, rec.ts - skew.offset_us)
        return Alert(
            stream_id=rec.stream_id, modality=rec.modality, kind=kind,
            score=min(1.0, max(0.0, score)), ts=ts,
            window_id=window_id(rec.stream_id, window_start(ts, skew.window_us)),
            trace_id=_trace_id(rec),
            source=Source(self._topic_of(rec.modality), rec.src_partition, rec.src_offset),
            emitted_at=self._clock_us(), detail=detail, event_ts=rec.ts,
            offset_ms=skew.offset_us / 1000.0, skew_confidence=skew.confidence,
            kafka_ts_ms=rec.kafka_ts_ms)

    def record(self, rec: FeatureRecord, skew: SkewView) -> list[Alert]:
        """The alerts of one record (none for a held frame: see :meth:`blind`)."""
        f, th = rec.feats, self.th
        out: list[Alert] = []
        if rec.modality == "image" and not self.unscored(rec):
            nsfw = f.get("nsfw")
            if isinstance(nsfw, int | float) and nsfw >= th.nsfw:
                detail: dict[str, Any] = {"threshold": th.nsfw}
                if f.get("reused"):  # a near-duplicate: the score of its stream's last frame
                    detail["reused"] = True
                if f.get("nsfw_int8"):  # scored at INT8 in a backlog (MMSYNC_DEGRADE_INT8)
                    detail["precision"] = "int8"
                out.append(self._alert(rec, "nsfw", float(nsfw), detail, skew))
            ocr = f.get("ocr")
            if th.ocr_terms and self._ocr_terms is not None and isinstance(ocr, str) and ocr:
                terms = self._ocr_terms(ocr)
                if terms:
                    out.append(self._alert(rec, "ocr_term", 1.0, {
                        "terms": terms, "text": ocr[:_OCR_DETAIL_CHARS]}, skew))
        elif rec.modality == "text" and th.terms:
            found = f.get("terms")
            if isinstance(found, list) and found:
                out.append(self._alert(rec, "term", 1.0, {"terms": [str(t) for t in found]},
                                       skew))
        return out

    def unscored(self, rec: FeatureRecord) -> bool:
        """A frame whose NSFW score is not its own, or missing while the models are on."""
        return bool(rec.feats.get("held")) or (self.models and "nsfw" not in rec.feats)

    def blind(self, recs: list[FeatureRecord], level: int, skew: SkewView) -> Alert | None:
        """One stream's frames of one batch: the ``blind`` alert if any went unscored."""
        held = [r for r in recs if r.modality == "image" and self.unscored(r)]
        if not held:
            return None
        first = min(held, key=lambda r: r.ts)
        off = sum("nsfw" not in r.feats for r in held)
        detail = {
            "skipped": len(held), "frames": len(recs), "level": level,
            # "off": no image model ran on these pictures; "sampled": they ran on other frames
            "reason": "off" if off == len(held) else "sampled",
            "ts_from": first.ts, "ts_to": max(r.ts for r in held),
            "offsets": [[r.src_partition, r.src_offset] for r in held],
            "trace_ids": [_trace_id(r) for r in held],
        }
        return self._alert(first, "blind", len(held) / len(recs), detail, skew)

    def batch(self, outs: Iterable[object], skew: Callable[[str, str], SkewView],
              level: int = 0, kinds: Collection[str] | None = None) -> BatchAlerts:
        """Every alert of one batch's outputs (feature records; anything else, a dead
        letter, is skipped), signal alerts in input order, then one ``blind`` per stream.
        ``kinds``: only alerts of these kinds (None: all). A frame's ``nsfw`` and ``blind``
        are decided from its score alone, before its OCR text exists (issue 26), and its
        ``ocr_term`` from the whole record later: :data:`SCORE_KINDS`, :data:`LATE_KINDS`."""
        res = BatchAlerts()
        frames: dict[str, list[FeatureRecord]] = {}
        for rec in outs:
            if not isinstance(rec, FeatureRecord):
                continue
            res.alerts += [a for a in self.record(rec, skew(rec.stream_id, rec.modality))
                           if kinds is None or a.kind in kinds]
            if rec.modality == "image":
                frames.setdefault(rec.stream_id, []).append(rec)
        if kinds is not None and "blind" not in kinds:
            return res
        for sid, recs in frames.items():
            b = self.blind(recs, level, skew(sid, "image"))
            if b is not None:
                res.alerts.append(b)
                reason = str(b.detail["reason"])
                res.skipped[reason] = res.skipped.get(reason, 0) + int(b.detail["skipped"])
        return res
