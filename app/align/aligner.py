"""Event-time windowing, watermarks and resampling onto the sync grid (pure).

Per stream, every feature record falls into the tumbling window
``floor((ts - offset) / W) * W`` on the reference (image) clock, where
``offset`` is the modality's estimated lag behind the reference
(``app.align.skew``; 0 with correction off). Records wait unbucketed until their
window closes, so a better estimate still moves them. A window closes when
the stream's watermark passes its end:

    watermark = min(newest corrected ts - margin of each *active* modality) - lateness

where the margin is up to ``max_skew`` while a modality's skew is unsure.

A modality is active while it has been heard from within ``idle_s`` of wall
time. A silent one (or one never heard from) keeps holding the watermark until
it is *idle*, which the :class:`app.align.progress.ProgressView` decides: in a
worker, when the input partition it arrives on has been processed to its end
(progress marks: slow is not idle); without marks, ``idle_s`` of silence. A
modality never heard from for a stream is idle no sooner than ``idle_s`` after
the stream's first record, marks or not: a mark's end is the log's end as its
agent last fetched it, so a fresh "drained" can predate the stream's first
records of that modality, already in the log but not fetched yet (a fresh
worker on the embedded broker sent the first frames and sound of a stream
whose caption came first late: 7 to 12 of 11,181 in
``scripts/bench_align.py``). It costs a stream that lacks a modality (no
captions) up to ``idle_s`` once, at its start. A stream that comes back after
falling silent (every modality silent for ``idle_s``: a broadcast's break) wakes:
a modality it had before, not heard since it woke, is idle no sooner than
``idle_s`` after that, by a mark read since. The stream's agents do not keep
pace with each other (captions are processed in milliseconds, frames queue
behind the image models), so its first captions were read while its sound and
frames of the same moment, already in their logs, were not, and the marks
that said their inputs drained were made before those came: the captions'
end (ts + duration) closed the windows the sound and frames belonged to, and
they went late (bench.py: 6 to 18 of 4,251 in the step after an overloaded
one, each one logged a stream's first sound or frame after the pause between
steps; docs/broker.md). A modality back alone after its silence (a camera turned back
on while the sound or the captions ran on) has no wake; its agent's last "drained" was
fetched before its new records came. So an idle modality other than the captions bounds
the watermark at the time its vouching mark's end was fetched, put on its own clock by
its recent records' ts less their Kafka timestamps (``-unseen``; ``unseen_us``): a
record made after that fetch lies no earlier. Without fetch times (older marks, no
marks) there is no such bound. When every modality is idle, the open windows close up
to those bounds, all of them where none is known. A record for a window that
already closed is *late*, except a *replayed* one (consumed again after a
takeover, not in any emitted window): it joins the oldest window still open.
A record whose ``seq`` was seen is a *duplicate*. Every record ends in exactly
one of: merged, late, duplicate (contract, "Accounting").

A window id stands for one set of inputs: a window, once emitted, is never
emitted again (``closed_until`` only grows, and survives a stream's eviction
in a small memory); after a takeover the runner restores it from the outputs
(``restore``).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from app.align.captions import CaptionPlacer, speech_segments
from app.align.grid import GridSpec, build_window
from app.align.progress import IdleAfter, ProgressView
from app.align.skew import SkewConfig, StreamSkew
from app.lru import LRU
from app.settings import MODALITIES, Settings
from schemas.aligned import AlignedWindow, LateEvent
from schemas.features import FeatureRecord

__all__ = ["AddResult", "Aligner", "AlignerConfig", "StreamState"]

#: The most a stream's caption offset reports (windows, captions placed by it) once its
#: captions are found to trail their speech each by its own delay (ASR): under _SURE.
_ASR_OFFSET_CONF = 0.45
#: From this confidence on, a modality's margin is its estimate's own uncertainty
#: (``StreamSkew.uncertainty_us``), not ``max_skew`` scaled by the doubt (issue 26: that
#: margin, 0.45 s median for the sound on bench.py's load, held most windows;
#: ``scripts/bench_watermark.py``).
_SURE = 0.5
#: How many recent seqs per stream and modality are remembered for de-duplication.
_SEQ_MEMORY = 8192


@dataclass(frozen=True, slots=True)
class AlignerConfig:
    window_us: int = 1_000_000
    lateness_us: int = 200_000
    idle_s: float = 2.0
    rate_hz: float = 20.0
    reference: str = "image"
    modalities: tuple[str, ...] = MODALITIES
    #: estimate each stream's skew and correct for it (off: every offset is 0).
    correct_skew: bool = True
    max_skew_us: int = 1_000_000
    #: how far captions may trail the speech, us (app.align.skew)
    max_text_skew_us: int = 2_500_000
    #: the signal each skew update compares, us.
    skew_segment_us: int = 2_000_000
    #: a stream with nothing open and no record for this long (wall clock, s) is
    #: forgotten, so a worker serving ever new streams holds bounded state.
    stream_ttl_s: float = 600.0

    @classmethod
    def from_settings(cls, s: Settings) -> AlignerConfig:
        return cls(window_us=s.window_ms * 1000, lateness_us=s.lateness_ms * 1000,
                   idle_s=s.idle_ms / 1000, rate_hz=s.sync_hz, correct_skew=s.skew_correction,
                   max_skew_us=s.max_skew_ms * 1000, max_text_skew_us=s.max_text_skew_ms * 1000,
                   skew_segment_us=s.skew_segment_ms * 1000, stream_ttl_s=s.stream_ttl_s)

    @property
    def tick_us(self) -> int:
        return round(1_000_000 / self.rate_hz)

    @property
    def ticks(self) -> int:
        return max(1, round(self.window_us * self.rate_hz / 1_000_000))


@dataclass(slots=True)
class AddResult:
    """What became of one record: ``merged``, ``late`` (with its LateEvent) or ``duplicate``."""

    outcome: str
    late: LateEvent | None = None
    window_start: int | None = None


@dataclass(slots=True)
class StreamState:
    first_seen: float
    skew: StreamSkew
    #: records not yet emitted. They are bucketed into windows only when
    #: their window closes, with the skew estimate of that moment, so a
    #: better estimate moves records that are still open.
    pending: list[FeatureRecord] = field(default_factory=list)
    #: newest raw (uncorrected) end time per modality, us.
    newest: dict[str, int] = field(default_factory=dict)
    heard: dict[str, float] = field(default_factory=dict)
    #: wall time (s) the stream's first record was read, or its first after the whole
    #: stream fell silent (every modality unheard for ``idle_s``): a modality heard
    #: before it and not since is idle no sooner than ``idle_s`` after it
    woke: float = 0.0
    #: every window ending at or before this has been emitted (or never had data).
    closed_until: int = -1
    seqs: dict[str, LRU[int, bool]] = field(default_factory=dict)
    #: the last image scalars, held across window boundaries (sample-and-hold).
    hold: dict[str, float] = field(default_factory=dict)
    #: the earliest ts pending per modality (raw), so a poll can tell at once that nothing
    #: can close yet
    pending_min: dict[str, int] = field(default_factory=dict)
    #: input partition each modality arrives on (the newest record's)
    inputs: dict[str, int] = field(default_factory=dict)
    #: the features partition the stream arrives on, if the caller said
    home: int | None = None
    #: recent captions and where each was placed on its own speech (issue 25)
    captions: CaptionPlacer = field(default_factory=CaptionPlacer)
    #: per modality, its recent records' ts less their Kafka timestamps, us: how its clock
    #: maps the wall clock its records were sent on (``Aligner.unseen_us``)
    leads: dict[str, deque[int]] = field(default_factory=dict)


#: How long (picture media time past the earliest of them, us) a stream's first captions
#: hold its windows while too few have come to tell subtitles from ASR captions. With 5 s
#: the corpus's held-out ASR captions went from p95 490 to 965 ms and subtitles from 48 to
#: 709 (captions every 2-4 s: the fourth comes within 16 s); unbounded, a stream with
#: fewer than four captions held its windows for as long as its picture ran.
_FIRST_CAPTIONS_HOLD_US = 20_000_000

#: ... and past the first _STEADY_MIN, while the captions have not been told apart yet (the
#: test found them ambiguous, or heard too little), up to this many: a stream's first four
#: captions closed their windows unplaced when the verdict came with the fifth (tune asr-13:
#: 0.5 to 0.9 s off). Bounded, as a stream whose sound has no speech is never told.
_FIRST_CAPTIONS_UNDECIDED = 8

#: Sound heard past a caption (its ts; delays go down to 0) before its window may close, us:
#: a segment of speech is found from 150 ms of it, and a few bins more (app.align.captions).
_CAPTION_SETTLE_US = 300_000

#: Records per modality whose ts less their Kafka timestamp ``StreamState.leads`` keeps.
_LEADS = 16

#: Streams forgotten after their TTL whose emitted-until is still remembered, so a very
#: late record cannot open an emitted window again (a few bytes each).
_GONE_MEMORY = 65_536


class Aligner:
    """Windows of many streams. Not thread-safe: one per aligner agent."""

    def __init__(self, cfg: AlignerConfig, progress: ProgressView | None = None) -> None:
        self.cfg = cfg
        self.progress: ProgressView = progress or IdleAfter(cfg.idle_s)
        self.streams: dict[str, StreamState] = {}
        self._gone: LRU[str, int] = LRU(_GONE_MEMORY)
        #: streams with pending records: the only ones a poll needs to look at.
        self._open: set[str] = set()
        self._skew_cfg = SkewConfig(max_skew_us=cfg.max_skew_us,
                                    max_text_skew_us=cfg.max_text_skew_us,
                                    segment_us=cfg.skew_segment_us, reference=cfg.reference)

    # -- skew --------------------------------------------------------------
    def offset_us(self, stream_id: str, modality: str) -> int:
        """Estimated lag of ``modality`` behind the reference in this stream, us."""
        st = self.streams.get(stream_id)
        return 0 if st is None else self.offset_us_of(st, modality)

    def confidence(self, stream_id: str, modality: str) -> float:
        """How sure ``modality``'s offset is, as windows report it (0..1)."""
        st = self.streams.get(stream_id)
        if modality == self.cfg.reference:
            return 1.0
        if st is None or not self.cfg.correct_skew:
            return 0.0
        return self._reported(st, modality)

    def _reported(self, st: StreamState, modality: str) -> float:
        """The offset's confidence as windows and captions placed by it report it: capped
        under the 0.5 that counts as sure for captions found to trail their speech each by
        its own delay (ASR), as one offset does not place them. Their offset's confidence
        rose over 0.5 now and then (5 % of held-out ASR windows, whose text offset was 335 ms
        off at p95 among those)."""
        conf = st.skew.confidence(modality)
        if modality == "text" and st.captions.decided and not st.captions.steady:
            return min(conf, _ASR_OFFSET_CONF)
        return conf

    def margin_us(self, st: StreamState, modality: str) -> int:
        """How far a modality's corrected time may still move, us.

        Until its skew is known with confidence, a modality's content for a
        window may arrive anywhere within ``max_skew`` of it: the watermark
        waits that much longer rather than turn correct records into late ones.
        Once its belief is concentrated enough to be right (confidence >= 0.5
        before it fades for want of new evidence: the belief itself widens by as
        much as the lag may drift meanwhile), the wait is how much larger the
        offset may yet be found (:meth:`StreamSkew.uncertainty_us`): a larger
        offset moves the modality's later records to earlier windows; a smaller
        one moves them to later windows, which are still open. Captions only
        while they share one shift (subtitles): an ASR caption trails its speech
        by its own delay, and the longer wait lets it join its speech's window.
        """
        if modality == self.cfg.reference or not self.cfg.correct_skew:
            return 0
        if st.skew.confidence(modality, recent=False) >= _SURE and (
                modality != "text" or st.captions.steady):
            return min(st.skew.uncertainty_us(modality), self.cfg.max_skew_us)
        return round(self.cfg.max_skew_us * (1.0 - st.skew.confidence(modality)))

    # -- input -------------------------------------------------------------
    def corrected_ts(self, rec: FeatureRecord) -> int:
        return rec.ts - self.offset_us(rec.stream_id, rec.modality)

    def _state(self, stream_id: str, now: float) -> StreamState:
        st = self.streams.get(stream_id)
        if st is None:
            st = self.streams[stream_id] = StreamState(
                first_seen=now, woke=now, skew=StreamSkew(self._skew_cfg, self.cfg.modalities))
            remembered = self._gone.pop(stream_id)
            st.closed_until = remembered if remembered is not None else -1
        return st

    def add(self, rec: FeatureRecord, now: float, *, replay: bool = False,
            home: int | None = None) -> AddResult:
        """Place one record. ``replay``: consumed again after a takeover (it joins the
        oldest open window if its own was emitted); ``home``: its features partition."""
        st = self._state(rec.stream_id, now)
        if home is not None:
            st.home = home
        st.inputs[rec.modality] = rec.src_partition
        if rec.seq is not None:
            seen = st.seqs.get(rec.modality)
            if seen is None:
                seen = st.seqs[rec.modality] = LRU(_SEQ_MEMORY)
            if rec.seq in seen:
                return AddResult("duplicate")
            seen.put(rec.seq, True)
        W = self.cfg.window_us
        ts = max(0, self.corrected_ts(rec))
        start = ts // W * W
        if st.heard and now - max(st.heard.values()) >= self.cfg.idle_s:
            st.woke = now  # the whole stream was silent: it starts again (module doc)
        st.heard[rec.modality] = now
        if rec.kafka_ts_ms > 0:
            lead = st.leads.get(rec.modality)
            if lead is None:
                lead = st.leads[rec.modality] = deque(maxlen=_LEADS)
            lead.append(rec.ts - rec.kafka_ts_ms * 1000)
        if start + W <= st.closed_until and not replay:
            late = LateEvent(
                stream_id=rec.stream_id, modality=rec.modality, ts=rec.ts, seq=rec.seq,
                trace_id=rec.trace_id, window_start=start, window_end=start + W,
                src_partition=rec.src_partition, src_offset=rec.src_offset,
                at=int(now * 1_000_000), feats=rec.feats,
            )
            return AddResult("late", late=late, window_start=start)
        st.newest[rec.modality] = max(st.newest.get(rec.modality, -1), rec.ts + rec.dur)
        st.pending.append(rec)
        st.pending_min[rec.modality] = min(st.pending_min.get(rec.modality, rec.ts), rec.ts)
        self._open.add(rec.stream_id)
        st.skew.observe(rec)
        if rec.modality == "text" and self.cfg.correct_skew:
            st.captions.add(rec.ts, rec.dur, rec.seq)
        return AddResult("merged", window_start=start)

    # -- output ------------------------------------------------------------
    def input_partition(self, st: StreamState, modality: str) -> int:
        """The input partition ``modality`` arrives on for this stream: its own records',
        else another modality's (inputs are co-partitioned by stream_id), else the
        features partition (the same partitioner on the same key)."""
        if modality in st.inputs:
            return st.inputs[modality]
        if st.inputs:
            return next(iter(st.inputs.values()))
        return st.home if st.home is not None else -1

    def watermark(self, st: StreamState, now: float) -> float:
        """Event time (us, reference clock) up to which the stream is complete."""
        marks = self.marks(st, now)
        if marks is None:
            return -math.inf
        return min(marks.values()) if marks else math.inf

    def marks(self, st: StreamState, now: float) -> dict[str, float] | None:
        """What bounds the stream's watermark, by what it comes from (us, reference
        clock): ``<modality>`` (its newest record less its offset and margin),
        ``<modality>-trails`` (an idle modality that trails the running picture),
        ``first-captions`` (a stream's first captions, until they are told apart) and
        ``caption-settle`` (captions whose speech may have only begun), each less the
        lateness where it applies. None: a modality never heard from may still be
        starting up (hold everything). The watermark is the least of them."""
        marks: dict[str, float] = {}
        ref = self.cfg.reference
        ref_heard = st.heard.get(ref)
        ref_active = ref_heard is not None and now - ref_heard < self.cfg.idle_s
        for m in self.cfg.modalities:
            heard = st.heard.get(m)
            since = heard if heard is not None else st.first_seen
            if heard is not None and heard < st.woke:
                since = st.woke  # heard before the stream fell silent, not since it woke
            active = heard is not None and now - heard < self.cfg.idle_s
            if not active and now - since >= self.cfg.idle_s \
                    and self.progress.drained(m, self.input_partition(st, m), now, since,
                                              via=st.home):
                # idle: nothing of it is waiting. But a modality that trails the
                # reference (captions 2 s behind the speech) has nothing *yet* for the
                # last stretch of the reference: while the reference runs, wait for that
                offset = self.offset_us_of(st, m)
                if ref_active and offset > 0 and m != ref and ref in st.newest:
                    marks[f"{m}-trails"] = (st.newest[ref] - offset - self.margin_us(st, m)
                                            - self.cfg.lateness_us)
                unseen = self.unseen_us(st, m, now)
                if unseen is not None:
                    marks[f"{m}-unseen"] = unseen
                continue
            newest = st.newest.get(m)
            if newest is None:
                if heard is None:
                    return None  # may still be starting up, or slow: hold everything
                continue  # heard only through late records: nothing of it is pending
            corrected = newest - self.offset_us_of(st, m) - self.margin_us(st, m)
            marks[m] = corrected - self.cfg.lateness_us
        ref_newest = st.newest.get(ref)
        cp = st.captions
        if (self.cfg.correct_skew and (cp.seen < CaptionPlacer.steady_min or (
                not cp.decided and cp.seen < _FIRST_CAPTIONS_UNDECIDED))
                and "text" in st.pending_min and self.confidence_of(st, "text") < 0.5
                and ref_active and ref_newest is not None
                and ref_newest - st.pending_min["text"] < _FIRST_CAPTIONS_HOLD_US):
            # too few captions yet to tell whether each has its own delay (ASR), and their
            # offset not known to hold: their speech may lie up to max_text_skew before
            # them, so their windows wait (only for a stream's first captions; then each
            # is placed and its window closes). Bounded: never once the picture has run
            # _FIRST_CAPTIONS_HOLD_US past the earliest of them, nor while the picture is
            # idle (a stream with fewer captions than that, or one that ended, held every
            # window after its first caption for ever: the demo emitted none)
            marks["first-captions"] = (st.pending_min["text"] - self.cfg.max_text_skew_us
                                       - self.cfg.lateness_us)
        if (self.cfg.correct_skew and not st.captions.steady and "text" in st.pending_min
                and "audio" in st.newest and now - st.heard.get("audio", -math.inf)
                < self.cfg.idle_s):
            # captions each on their own speech (ASR): one whose speech may have only begun
            # (the sound heard ends less than _CAPTION_SETTLE_US after the caption: delays
            # go down to 0) may move later once it is heard, so its window waits for that.
            # Placed on the speech heard so far, a caption 0.5 s behind its words went 1.5 s
            # early, at confidence 1, its window closed before the next round (tune asr-01)
            sound_to = st.newest["audio"] - self.offset_us_of(st, "audio")  # reference clock
            settle = [self.caption_place(st, r)[0] for r in st.pending
                      if r.modality == "text" and r.ts + _CAPTION_SETTLE_US > sound_to]
            if settle:
                marks["caption-settle"] = min(settle)
        return marks

    def unseen_us(self, st: StreamState, modality: str, now: float) -> float | None:
        """How far an idle ``modality`` lets the stream's windows close (us, reference
        clock, less the lateness): its "drained" vouches only for records made before its
        agent last fetched the end (``ProgressView.covered``), and one made after that
        lies no earlier than that time on the modality's own clock (its recent records'
        least ts less their Kafka timestamp). None where either is not known, or for
        captions, whose place on their speech the caption holds bound (module doc)."""
        if modality == "text":
            return None
        lead = st.leads.get(modality)
        if not lead:
            return None
        covered = self.progress.covered(modality, self.input_partition(st, modality), now,
                                        via=st.home)
        if covered is None:
            return None
        return (covered * 1e6 + min(lead) - self.offset_us_of(st, modality)
                - self.margin_us(st, modality) - self.cfg.lateness_us)

    def offset_us_of(self, st: StreamState, modality: str) -> int:
        return st.skew.offset_us(modality) if self.cfg.correct_skew else 0

    # -- captions, each on its own speech (issue 25) ----------------------------
    def _place_captions(self, st: StreamState) -> None:
        """Align the stream's recent captions with the speech in its sound
        (:class:`app.align.captions.CaptionPlacer`): captions known to have each their own
        delay (ASR) are placed one by one anywhere in the band captions may lag; the rest
        keep the stream's caption offset."""
        cp, skew = st.captions, st.skew
        span = cp.window(self.cfg.max_text_skew_us, -self.cfg.max_skew_us)
        if span is None:
            return
        env, first = skew.sound_level(span[0], min(span[1], skew.newest("audio")),
                                      whole=not cp.decided)
        # the span starts max_text_skew before the oldest recent caption, often before the
        # sound still held (its horizon): place on the stretch known. Skipping the whole
        # span for it left a stream's first four captions (spread over 15 s) at the
        # offset, 1.9 to 3 s off (corpus asr-05, tune set)
        known = np.flatnonzero(np.isfinite(env))
        if len(known):
            env, first = env[known[0]:], first + int(known[0])
        if not len(env) or np.isnan(env).mean() > 0.5:
            cp.dirty = False
            return
        # a segment at the first bin known, later than the stream's first sound, began in
        # sound no longer held: its start is not the speech's (tune asr-14, 0.7 s off)
        segs = speech_segments(env, first, open_start=first > (skew.first_sound_bin or 0))
        cp.place(segs, lo_us=-self.cfg.max_skew_us, hi_us=self.cfg.max_text_skew_us,
                 audio_offset_us=skew.offset_us("audio"),
                 heard_us=skew.newest("audio"), text_conf=skew.confidence("text"),
                 asr_delay_us=self.cfg.max_text_skew_us / 2,
                 audio_conf=skew.confidence("audio") if "audio" in self.cfg.modalities else 1.0)

    def confidence_of(self, st: StreamState, modality: str) -> float:
        return st.skew.confidence(modality) if self.cfg.correct_skew else 0.0

    def caption_place(self, st: StreamState, rec: FeatureRecord) -> tuple[int, float]:
        """A caption's aligned time (reference clock, us) and its confidence, as the stream's
        :class:`CaptionPlacer` last placed it; one never placed (no sound around it yet, or
        correction off) is at its ts less the captions' offset, with that offset's
        confidence."""
        got = st.captions.placed.get(CaptionPlacer.key(rec.ts, rec.seq))
        if got is not None and self.cfg.correct_skew:
            return (max(0, got[0]), got[1])
        return (max(0, rec.ts - self.offset_us_of(st, rec.modality)),
                self._reported(st, rec.modality) if self.cfg.correct_skew else 0.0)

    def ref_ts(self, st: StreamState, rec: FeatureRecord) -> int:
        """A record's time on the reference clock, us: its ts less its modality's offset, or
        for a caption its aligned time."""
        if rec.modality == "text":
            return self.caption_place(st, rec)[0]
        return max(0, rec.ts - self.offset_us_of(st, rec.modality))

    def poll(self, now: float, streams: Iterable[str] | None = None) -> list[
        tuple[str, int, list[FeatureRecord]]
    ]:
        """Close every window the watermark has passed: (stream_id, start, records)."""
        out: list[tuple[str, int, list[FeatureRecord]]] = []
        W = self.cfg.window_us
        for sid in list(self._open if streams is None else streams):
            st = self.streams.get(sid)
            if st is None or not st.pending:
                self._open.discard(sid)
                continue
            if self.cfg.correct_skew:
                if (st.skew.maybe_update() or st.captions.dirty) and "text" in st.pending_min:
                    self._place_captions(st)
            wm = self.watermark(st, now)
            if wm == -math.inf:
                continue
            if math.isfinite(wm) and self._earliest_end(st) > wm:
                # nothing pending can close yet (the common case): no pass over the records
                if wm > 0:
                    st.closed_until = max(st.closed_until, int(wm) // W * W)
                continue
            buckets: dict[int, list[FeatureRecord]] = {}
            keep: list[FeatureRecord] = []
            for rec in st.pending:
                start = self.ref_ts(st, rec) // W * W
                # a record whose window closed since it came in (the skew
                # estimate moved it back) joins the oldest window still open
                start = max(start, st.closed_until)
                if start + W <= wm:
                    buckets.setdefault(start, []).append(rec)
                else:
                    keep.append(rec)
            st.pending = keep
            st.pending_min = {}
            for rec in keep:
                st.pending_min[rec.modality] = min(st.pending_min.get(rec.modality, rec.ts),
                                                   rec.ts)
            if not keep:
                self._open.discard(sid)
            for start in sorted(buckets):
                out.append((sid, start, buckets[start]))
                st.closed_until = max(st.closed_until, start + W)
            if math.isfinite(wm) and wm > 0:
                st.closed_until = max(st.closed_until, int(wm) // W * W)
        return out

    def _earliest_end(self, st: StreamState) -> int:
        """The end of the earliest window a pending record can fall in, us."""
        W = self.cfg.window_us
        start = min((max(0, ts - self.offset_us_of(st, m)) // W * W
                     for m, ts in st.pending_min.items() if m != "text"), default=None)
        if "text" in st.pending_min:  # captions each on their own speech: look at each
            caps = min(self.ref_ts(st, r) for r in st.pending if r.modality == "text") // W * W
            start = caps if start is None else min(start, caps)
        return max(start or 0, st.closed_until) + W

    def forget(self, stream_ids: Iterable[str]) -> None:
        """Drop the state of streams this worker no longer owns (after a rebalance)."""
        for sid in stream_ids:
            self.streams.pop(sid, None)
            self._open.discard(sid)

    def evict_idle(self, now: float) -> list[str]:
        """Forget streams with nothing pending and no record for ``stream_ttl_s``.

        What a forgotten stream loses: its seqs (a very late duplicate is merged
        again) and its skew estimate; how far its windows were emitted is kept
        (``_GONE_MEMORY`` streams), so a very late record goes late instead of
        opening an emitted window again.
        """
        ttl = self.cfg.stream_ttl_s
        gone = [sid for sid, st in self.streams.items() if not st.pending
                and now - max(st.heard.values(), default=st.first_seen) > ttl]
        for sid in gone:
            self._gone.put(sid, self.streams[sid].closed_until)
        self.forget(gone)
        return gone

    def restore(self, stream_id: str, closed_until: int, offsets_us: dict[str, int],
                confidence: dict[str, float], now: float, home: int | None = None) -> None:
        """What the outputs say of a stream this aligner takes over: windows up to
        ``closed_until`` were emitted (never again), and the skew estimate then."""
        st = self._state(stream_id, now)
        st.closed_until = max(st.closed_until, closed_until)
        if home is not None:
            st.home = home
        if self.cfg.correct_skew:
            st.skew.restore(offsets_us, confidence)

    def open_records(self) -> int:
        return sum(len(st.pending) for st in self.streams.values())

    def describe(self, stream_id: str, now: float) -> str:
        """A stream's windowing state in one line (for the log when its records go late):
        how far its windows were closed, each modality's newest ts and how long ago it was
        heard (s), and the watermark's bounds by name (us on the reference clock)."""
        st = self.streams.get(stream_id)
        if st is None:
            return f"{stream_id}: not held here"
        marks = self.marks(st, now)
        heard = {m: round(now - t, 2) for m, t in st.heard.items()}
        bounds = "hold all" if marks is None else {k: int(v) for k, v in marks.items()}
        return (f"{stream_id}: closed until {st.closed_until}, newest {st.newest}, heard "
                f"{heard} s ago, woke {now - st.woke:.2f} s ago, pending {len(st.pending)}, "
                f"home {st.home}, inputs {st.inputs}, bounds {bounds}")

    def caption_places(self, stream_id: str, records: Iterable[FeatureRecord]
                       ) -> list[tuple[FeatureRecord, int, float]]:
        """(caption, aligned ts on the reference clock, confidence) of each caption in
        ``records``, as :meth:`poll` placed them."""
        st = self.streams.get(stream_id)
        out = []
        for r in records:
            if r.modality != "text":
                continue
            if st is None:
                out.append((r, max(0, r.ts), 0.0))
            else:
                out.append((r, *self.caption_place(st, r)))
        return out

    def window(self, stream_id: str, start: int, records: list[FeatureRecord],
               emitted_at: int) -> AlignedWindow:
        """The AlignedWindow of records :meth:`poll` closed, on the grid, with the offsets
        and confidences of this moment; carries the stream's held image values on. Each
        caption is placed at its aligned time (``captions``)."""
        cfg = self.cfg
        st = self.streams.get(stream_id)
        mods = cfg.modalities
        g = GridSpec(start_us=start, window_us=cfg.window_us, ticks=cfg.ticks,
                     tick_us=cfg.tick_us)
        placed = {id(r): (ts, conf) for r, ts, conf in self.caption_places(stream_id, records)}
        timed = [(placed[id(r)][0] if id(r) in placed else self.corrected_ts(r), r)
                 for r in records]
        captions = [{"trace_id": r.trace_id, "ts": r.ts, "aligned_ts": placed[id(r)][0],
                     "conf": placed[id(r)][1]} for r in records if id(r) in placed]
        win, held = build_window(
            stream_id, g, timed, rate_hz=cfg.rate_hz,
            modalities=mods, hold=st.hold if st is not None else {},
            offsets_ms={m: self.offset_us(stream_id, m) / 1000.0 for m in mods},
            confidence={m: self.confidence(stream_id, m) for m in mods}, emitted_at=emitted_at)
        win.captions = sorted(captions, key=lambda c: c["aligned_ts"])
        if st is not None:
            st.hold = held
        return win
