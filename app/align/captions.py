"""Per-caption alignment: each caption placed on the speech it belongs to (pure: numpy and
dtaidistance).

One offset per window cannot place ASR captions: each trails its speech by its
own delay (0.3 to 2.5 s). What places them is the order and the shape of both
sequences: the recent captions (start, duration) against the recent speech
segments in the sound (start, duration, from the level ``env``), aligned
monotonically by dynamic time warping (dtaidistance's C implementation,
``dtw_ndim.warping_paths``) on two features:

- time: the caption's start less the typical delay against the speech start,
  in units of ``time_scale_us`` (wide: ASR delays vary by seconds);
- duration: the caption's duration against the segment's (an ASR caption
  lasts about as long as its words), in units of ``dur_scale_us``.

The speech side is a subsequence (``psi``: free start and end), so the recent
captions are matched to the stretch of speech they cover, and speech without a
caption (a dropped one, or one merged into its neighbour) costs nothing at the
ends (inside, it is absorbed by a neighbour's row and costs its distance). A
caption's aligned time is the start of the segment it is matched to;
a caption split from the one before (both matched to one segment) starts
where the first part's duration ends.

Confidence from the alignment's local margin: the best total cost of a path
through (caption, segment) for each segment (forward plus backward cost), how
much worse the best *other* segment is, ``1 - exp(-margin / MARGIN_SCALE)``;
segments outside the caption's delay band are never its own. A caption whose
two best segments tie gets confidence near 0.

Captions that share one shift (subtitles, found by :func:`one_shift`) are not
placed here: :class:`CaptionPlacer` leaves them, and a stream's first three,
to the stream's caption offset, which places subtitles better than the speech
starts found in the level (docs/benchmarks.md, issue 25).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from dtaidistance import dtw_ndim

from app.align.lag import BIN_US

__all__ = ["Cap", "CaptionPlacer", "Placed", "Segment", "Shift", "align_captions", "one_shift",
           "speech_segments"]

#: Speech segments: dips between syllables shorter than this are bridged, runs shorter
#: than that dropped (10 ms bins), and the level must span this much, dB.
_BRIDGE_BINS = 25
_MIN_BINS = 15
_MIN_RANGE_DB = 12.0
#: Margin (squared feature units) at which confidence reaches 1 - 1/e.
MARGIN_SCALE = 1.5
#: Placements remembered per stream (a caption's window closes long before this many more).
_PLACED_MEMORY = 256
#: A caption fits a shift when its start lies this close to a speech start under it, us ...
_SHIFT_TOL_US = 80_000
#: ... and captions share one shift (subtitles) when this share of at least _STEADY_MIN fit.
_STEADY_SHARE = 0.75
_STEADY_MIN = 4
#: Once the captions were found not to share one shift (ASR), they are taken to share one
#: again only after this many new captions in a row say so: with captions every 3 s the
#: recent ones are just four, and three ASR delays within 80 ms of one shift (talking-07 of
#: the tune set: 2.1 to 2.2 s) put a stream's last captions on the offset, 300 ms off.
_STEADY_CONFIRM = 4
#: ... and, once they did share one, they are taken not to after this many (a subtitled
#: clip's 27 captions went to the alignment for three rounds, 1.8 s off; tune set)
_ASR_CONFIRM = 2
#: The captions' offset confidence from which it votes for one shift (:meth:`_verdict`):
#: ASR captions' stays under it (1% of windows on the tune set), subtitles' mostly over (75%).
_STEADY_TEXT_CONF = 0.5
#: ... and from which it settles the verdict at once. Between the two, a vote: ASR captions'
#: confidence rose over 0.5 for a round or two among a stream's first 12 captions (tune
#: asr-19: 0.53 at the fourth, which put its first six back on the offset, 0.5 to 1.5 s
#: off, after the alignment had placed them within 50 ms), never over 0.8 (max 0.79);
#: subtitles' is over 0.8 in 69 % of rounds from their eighth caption on (tune set).
_STEADY_TEXT_SURE = 0.8
#: A caption the alignment places with less confidence than this keeps the stream's
#: caption offset: two segments tie for it (music's beats read as speech put the last
#: captions of two subtitled clips 1.9 s off at confidence 0.005; tune set).
_PLACE_MIN_CONF = 0.1
#: ... and every caption does while the sound's offset is this unsure.
_PLACE_MIN_AUDIO_CONF = 0.1
#: A segment ending this close to the end of the sound heard may still go on, us.
_OPEN_END_US = 2 * BIN_US
#: An ASR caption runs up to this long past its words, us: its duration less it is theirs.
_CAPTION_TAIL_US = 150_000
#: Confidence of a caption placed inside a segment (split from the one before).
_SPLIT_CONF = 0.45
#: ... when that segment goes on at least this long after the first caption's words, us
#: (and the caption's delay behind that point may exceed the band by as much: the point
#: is an estimate from the first caption's duration)
_SPLIT_REST_US = 300_000


@dataclass(frozen=True, slots=True)
class Segment:
    """A stretch of speech in the sound, us on the sound's clock."""

    start_us: float
    end_us: float

    @property
    def dur_us(self) -> float:
        return self.end_us - self.start_us


@dataclass(frozen=True, slots=True)
class Cap:
    """A caption: its start on the text clock and its duration, us."""

    ts_us: int
    dur_us: int


@dataclass(frozen=True, slots=True)
class Placed:
    """Where a caption's speech starts, us on the sound's clock, and how sure (0..1)."""

    speech_us: float
    conf: float
    segment: int


def speech_segments(env_db: np.ndarray, first_bin: int, *, open_start: bool = False
                    ) -> list[Segment]:
    """Utterances in a level series (dB per 10 ms bin from ``first_bin``, NaN unknown): runs
    of bins louder than half-way (in dB) between the quiet (10th percentile) and the loud
    (95th), with dips shorter than ``_BRIDGE_BINS`` bridged (the gaps between syllables)
    and runs shorter than ``_MIN_BINS`` dropped. A stretch with less than ``_MIN_RANGE_DB``
    between quiet and loud has no speech to find. ``open_start``: the sound before the
    first bin was there but is not given, so a run from the first bin has no known start
    and is left out."""
    e = np.asarray(env_db, dtype=np.float64)
    known = np.isfinite(e)
    if known.sum() < 10:
        return []
    lo, hi = np.percentile(e[known], [10, 95])
    if hi - lo < _MIN_RANGE_DB:
        return []
    loud = np.where(known, e > (lo + hi) / 2, False)
    edges = np.diff(np.concatenate(([0], loud.astype(np.int8), [0])))
    runs = list(zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1), strict=True))
    merged: list[list[int]] = []
    for a, b in runs:
        if merged and a - merged[-1][1] < _BRIDGE_BINS:
            merged[-1][1] = int(b)
        else:
            merged.append([int(a), int(b)])
    return [Segment((first_bin + a) * BIN_US, (first_bin + b) * BIN_US)
            for a, b in merged if b - a >= _MIN_BINS and not (open_start and a == 0)]


def _features(caps: Sequence[Cap], segs: Sequence[Segment], delay_us: float, time_scale: float,
              dur_scale: float) -> tuple[np.ndarray, np.ndarray]:
    # the caption's duration runs up to 300 ms past its words (ASR): its middle is matched
    a = np.array([[(c.ts_us - delay_us) / time_scale, (c.dur_us - _CAPTION_TAIL_US) / dur_scale]
                  for c in caps], dtype=np.float64)
    b = np.array([[s.start_us / time_scale, s.dur_us / dur_scale] for s in segs],
                 dtype=np.float64)
    return a, b


def _starts(caps: Sequence[Cap], out: Sequence[Placed | None],
            segs: Sequence[Segment]) -> list[float]:
    """Where each placed caption's words start, us (NaN: not placed): its segment's start,
    or for the later of captions on one segment (split from the earlier) where the words
    of the one before end, at most the segment's end."""
    starts: list[float] = []
    for i, p in enumerate(out):
        prev = out[i - 1] if i else None
        if p is None:
            starts.append(math.nan)
        elif prev is not None and prev.segment == p.segment:
            starts.append(min(starts[-1] + _words(caps[i - 1]), segs[p.segment].end_us))
        else:
            starts.append(p.speech_us)
    return starts


def _words(cap: Cap) -> float:
    """How long a caption's words last, us: its duration less its tail."""
    return max(0.0, cap.dur_us - _CAPTION_TAIL_US)


def _paths(a: np.ndarray, b: np.ndarray, penalty: float) -> np.ndarray:
    """Accumulated squared cost (n+1 x m+1), the speech side's start and end free."""
    m = len(b)
    _, p = dtw_ndim.warping_paths(a, b, use_c=True, psi=(0, 0, m, m), psi_neg=False,
                                  penalty=penalty)
    return np.square(p)


def align_captions(caps: Sequence[Cap], segs: Sequence[Segment], *, delay_us: float,
                   lo_us: float, hi_us: float, time_scale_us: float = 1_000_000.0,
                   dur_scale_us: float = 250_000.0, penalty: float = 0.5,
                   heard_us: float = math.inf) -> list[Placed | None]:
    """Place each caption (in order) on a speech segment (in order), monotonically.

    ``delay_us``: the expected delay of a caption behind its speech; ``lo_us``..``hi_us``:
    the delays allowed (a segment outside them is never a caption's own). ``heard_us``:
    where the sound heard so far ends; a segment that reaches it may go on, and is taken
    to be as long as the newest caption's words if it is shorter. Returns one
    :class:`Placed` per caption, None where no segment lies in its band.
    """
    n, m = len(caps), len(segs)
    if n == 0:
        return []
    if m == 0:
        return [None] * n
    if segs[-1].end_us >= heard_us - _OPEN_END_US:
        # its end is not known yet: measured as heard, the newest words' segment looked as
        # short as the one before and their caption went there, 1.5 s early at confidence
        # 1 (tune asr-01)
        words = caps[-1].dur_us - _CAPTION_TAIL_US
        if segs[-1].dur_us < words:
            segs = [*segs[:-1], Segment(segs[-1].start_us, segs[-1].start_us + words)]

    def match(segs: Sequence[Segment], origin: np.ndarray) -> tuple[list[Placed | None], float]:
        """Each caption's segment and confidence, and the best path's cost."""
        a, b = _features(caps, segs, delay_us, time_scale_us, dur_scale_us)
        fwd = _paths(a, b, penalty)[1:, 1:]
        bwd = _paths(a[::-1].copy(), b[::-1].copy(), penalty)[1:, 1:][::-1, ::-1]
        local = np.square(a[:, None, :] - b[None, :, :]).sum(axis=2)
        total = fwd + bwd - local  # the best path's cost through each cell
        delays = np.array([[c.ts_us - s.start_us for s in segs] for c in caps])
        total = np.where((delays >= lo_us) & (delays <= hi_us), total, np.inf)
        got: list[Placed | None] = []
        for i in range(n):
            row = total[i]
            j = int(np.argmin(row))
            if not math.isfinite(row[j]):
                got.append(None)
                continue
            # the rival is the best segment of another utterance: the parts of one cut below
            # are one path's, and tie
            rest = row[origin != origin[j]]
            margin = float(rest.min() - row[j]) if len(rest) else math.inf
            conf = 1.0 - math.exp(-margin / MARGIN_SCALE) if math.isfinite(margin) else 1.0
            got.append(Placed(speech_us=segs[j].start_us, conf=conf, segment=j))
        return got, float(fwd[-1].min())

    def words_end(i: int, p: Placed) -> float:  # where caption i, placed at p, stops speaking
        return p.speech_us + _words(caps[i])

    origin = np.arange(len(segs))
    out, cost = match(segs, origin)
    # Split-aware (as subtitle synchronisers align): a caption whose words end well inside
    # its segment, the next caption on a later one, may be the first part of a split
    # utterance (or of two utterances a bridged dip apart). The segment is cut where its
    # words end, and the cut kept if the whole alignment costs less: the second part of a
    # split went to the next utterance at confidence 0.97, 1.3 s off, and pushed the
    # caption after it off its own (tune asr-02, asr-23).
    # Bounded: at most n rounds (each keeps one cut or stops) of at most n - 1 trials, two
    # DTWs of n x (m + cuts) each; the placer aligns its last 8 captions
    # (CaptionPlacer.keep): at most 56 trials per placement.
    cut = np.zeros(len(segs), dtype=bool)  # segments that begin at a cut, not at speech
    for _ in range(n):
        best: tuple[float, list[Segment], np.ndarray, np.ndarray, list[Placed | None]] | None
        best = None
        starts = _starts(caps, out, segs)
        for i in range(n - 1):
            p, q = out[i], out[i + 1]
            if p is None or (q is not None and q.segment == p.segment):
                continue
            j, seg = p.segment, segs[p.segment]
            # the next caption's words are the rest of the segment: where the first part's
            # words end (it may itself be the second part of a split: from where its words
            # start) and where the next one's begin, counted back from the segment's end,
            # are two estimates of the cut, each within the caption's tail (0 to 300 ms)
            first, rest = starts[i] + _words(caps[i]), seg.end_us - _words(caps[i + 1])
            if (first + _SPLIT_REST_US > seg.end_us or abs(first - rest) > 2 * _CAPTION_TAIL_US
                    or first - seg.start_us < _MIN_BINS * BIN_US):
                continue
            at = (first + rest) / 2
            trial = [*segs[:j], Segment(seg.start_us, at), Segment(at, seg.end_us),
                     *segs[j + 1:]]
            t_origin = np.insert(origin, j + 1, origin[j])
            t_out, t_cost = match(trial, t_origin)
            a_, b_ = t_out[i], t_out[i + 1]
            if (a_ is not None and a_.segment == j and b_ is not None and b_.segment == j + 1
                    and t_cost < cost - 1e-9 and (best is None or t_cost < best[0])):
                best = (t_cost, trial, t_origin, np.insert(cut, j + 1, True), t_out)
        if best is None:
            break
        cost, segs, origin, cut, out = best
    out = [p if p is None or not cut[p.segment]
           else Placed(speech_us=p.speech_us, conf=min(p.conf, _SPLIT_CONF), segment=p.segment)
           for p in out]
    # two captions on one segment: the later one was split from the earlier, and its
    # words start where the earlier caption's end (its duration, less its tail)
    starts = _starts(caps, out, segs)
    for i in range(1, n):
        prev, cur = out[i - 1], out[i]
        if prev is not None and cur is not None and cur.segment == prev.segment:
            out[i] = Placed(speech_us=starts[i], conf=min(cur.conf, _SPLIT_CONF),
                            segment=cur.segment)
    # a caption with no segment in its band whose words may go on the segment of the one
    # before: two utterances less than a bridged dip apart make one segment, which starts
    # too early for the second caption's delay (tune asr-10: 2.8 s off, at the offset)
    for i in range(1, n):
        prev = out[i - 1]
        if out[i] is not None or prev is None:
            continue
        seg = segs[prev.segment]
        at = words_end(i - 1, prev)
        if (at + _SPLIT_REST_US <= seg.end_us
                and lo_us <= caps[i].ts_us - at <= hi_us + _SPLIT_REST_US):
            out[i] = Placed(speech_us=at, conf=min(prev.conf, _SPLIT_CONF), segment=prev.segment)
    return out


class Shift(NamedTuple):
    """What :func:`one_shift` found: the delay, how many captions fit it, among how many
    whose speech under it has been heard."""

    delay_us: float
    fits: int
    heard: int

    @property
    def share(self) -> float:
        """The share of heard captions that fit; NaN where fewer than ``_STEADY_MIN - 1``
        have been heard: too few to tell."""
        return self.fits / self.heard if self.heard >= _STEADY_MIN - 1 else math.nan


def one_shift(caps: Sequence[Cap], segs: Sequence[Segment], *, lo_us: float, hi_us: float,
              tol_us: float = _SHIFT_TOL_US, heard_us: float = math.inf) -> Shift:
    """The one delay that puts the most captions on a speech start (subtitles: a constant
    shift), searched over ``lo_us``..``hi_us`` at 10 ms, each caption's miss capped at
    ``tol_us`` (a caption without speech of its own costs the same wherever the shift is);
    with how many captions lie within ``tol_us`` of a start, among those whose speech
    under it has been heard (before ``heard_us``)."""
    if not caps or not segs:
        return Shift(0.0, 0, 0)
    d = np.arange(lo_us, hi_us + 1, BIN_US, dtype=np.float64)
    ts = np.array([c.ts_us for c in caps], dtype=np.float64)
    starts = np.array([s.start_us for s in segs], dtype=np.float64)
    # miss[k, i]: caption i's distance to its nearest start under delay k
    at = ts[None, :] - d[:, None]
    miss = np.abs(at[:, :, None] - starts[None, None, :]).min(axis=2)
    heard = at + tol_us < heard_us
    miss = np.where(heard, np.minimum(miss, tol_us), tol_us)
    k = int(np.argmin(miss.sum(axis=1)))
    return Shift(float(d[k]), int((miss[k] < tol_us).sum()), int(heard[k].sum()))


@dataclass(slots=True)
class _Recent:
    key: tuple[int, int]
    cap: Cap


class CaptionPlacer:
    """One stream's recent captions and where each was last placed (reference clock, us).

    The aligner adds every caption it merges and calls :meth:`place` before it buckets
    records: the last ``keep`` captions (within ``span_us`` of the newest) are aligned
    afresh against the speech the sound holds now, so a caption's place improves as its
    neighbours and their speech arrive, until its window closes.
    """

    #: how many captions tell subtitles (one shift) from ASR (each its own delay)
    steady_min = _STEADY_MIN

    def __init__(self, keep: int = 8, span_us: int = 10_000_000) -> None:
        self.keep, self.span_us = keep, span_us
        self._recent: list[_Recent] = []
        #: key -> (aligned ts on the reference clock, us; confidence)
        self.placed: dict[tuple[int, int], tuple[int, float]] = {}
        self.dirty = False
        #: whether the recent captions share one shift (or are too few to tell)
        self.steady = True
        #: captions added so far
        self.seen = 0
        #: new captions in a row whose test said the opposite of the verdict, the ``seen``
        #: of the last of them, and whether there is a verdict yet (:meth:`_verdict`)
        self._votes = 0
        self._voted_at = 0
        self._decided = False

    @staticmethod
    def key(ts: int, seq: int | None) -> tuple[int, int]:
        return (ts, -1 if seq is None else seq)

    def add(self, ts: int, dur: int, seq: int | None) -> None:
        self._recent.append(_Recent(self.key(ts, seq), Cap(ts, dur)))
        self.seen += 1
        self._recent.sort(key=lambda r: r.cap.ts_us)
        newest = self._recent[-1].cap.ts_us
        # the last ``keep`` within ``span_us`` of the newest, but never fewer than it takes
        # to tell ASR from subtitles, and all the last ``keep`` until that is told (their
        # windows wait for it: tune asr-13's first caption, dropped here before the verdict
        # came with its fifth, was never placed, and its split second half took its speech)
        recent = self._recent[-self.keep:]
        self._recent = [r for k, r in enumerate(recent) if r.cap.ts_us >= newest - self.span_us
                        or k >= len(recent) - _STEADY_MIN or not self._decided]
        self.dirty = True

    def _verdict(self, shared: bool) -> bool:
        """Whether the captions count as sharing one shift, given this round's test. The
        first verdict is taken as it comes; a later one changes it only once it held for
        new captions in a row: ``_STEADY_CONFIRM`` to go back to one shift, ``_ASR_CONFIRM``
        to leave it (four recent captions are few: one round's test is noisy both ways)."""
        if not self._decided:
            self._decided = True
            return shared
        if shared == self.steady:
            self._votes = 0
            return shared
        if self.seen != self._voted_at:
            self._votes, self._voted_at = self._votes + 1, self.seen
        need = _ASR_CONFIRM if self.steady else _STEADY_CONFIRM
        if self._votes >= need:
            self._votes = 0
            return shared
        return self.steady

    @property
    def decided(self) -> bool:
        """Whether the captions were ever judged (one shift or each its own)."""
        return self._decided

    def forget(self, key: tuple[int, int]) -> None:
        self.placed.pop(key, None)

    def window(self, hi_us: int, lo_us: int) -> tuple[int, int] | None:
        """The span of the sound (us, its clock) the recent captions' speech may lie in."""
        if not self._recent:
            return None
        return (self._recent[0].cap.ts_us - hi_us - 300_000,
                self._recent[-1].cap.ts_us - lo_us + 300_000)

    def place(self, segs: Sequence[Segment], *, lo_us: float, hi_us: float,
              audio_offset_us: float, audio_conf: float, heard_us: float = math.inf,
              text_conf: float = 0.0,
              asr_delay_us: float = 1_250_000.0,
              asr_time_scale_us: float = 1_000_000.0, asr_dur_scale_us: float = 250_000.0) -> None:
        """Align the recent captions with ``segs`` (on the sound's clock) and record where
        each goes, on the reference clock (the segments are moved onto it by the sound's
        offset first; delays are the captions' behind the picture).

        Captions are placed one by one only once they are known not to share one shift:
        at least ``_STEADY_MIN`` of them heard and :func:`one_shift` fitting fewer than
        ``_STEADY_SHARE`` (ASR: each its own delay; :func:`align_captions`, wide around
        ``asr_delay_us``, none before its speech), the verdict changing only as
        :meth:`_verdict` says. Captions that share one (subtitles: also whenever the
        caption offset's confidence ``text_conf`` is at least ``_STEADY_TEXT_CONF``), too
        few to tell, those the alignment ties on, and all while the sound's offset is
        unknown (``audio_conf`` under ``_PLACE_MIN_AUDIO_CONF``), are left to the stream's
        caption offset (``placed`` drops them; the aligner places them by that offset).
        Measured on the tune set: speech starts
        found in the level were later and less steady than the offset the lag tracker finds
        for subtitles, and placing the first three captions of a stream one by one put
        subtitles' p95 from 0.5 s to 1.3 s (ASR's first three cost them less).
        ``heard_us``: how far the sound has come (its clock): speech past it is unknown."""
        self.dirty = False
        if not self._recent or not segs:
            return
        ref = [Segment(s.start_us - audio_offset_us, s.end_us - audio_offset_us) for s in segs]
        caps = [r.cap for r in self._recent]
        heard_to = heard_us - audio_offset_us  # the sound so far, on the reference clock
        shift = one_shift(caps, ref, lo_us=lo_us, hi_us=hi_us, heard_us=heard_to)
        fits, share = shift.fits, shift.share
        if self.seen >= _STEADY_MIN and text_conf >= _STEADY_TEXT_SURE:
            # the lag tracker found one caption offset it is sure of: subtitles, whatever
            # the speech starts say (continuous speech makes one segment of many captions,
            # music's beats many segments of none: both failed the test below, and their
            # captions went to the alignment, up to 1.9 s off; tune set). No need to wait
            # for votes: the tracker's confidence is itself the sum of many captions
            self.steady, self._votes, self._decided = True, 0, True
        elif self.seen >= _STEADY_MIN and text_conf >= _STEADY_TEXT_CONF and self._decided:
            # fairly sure: a vote for one shift, as the test below would cast it (never the
            # first verdict: tune asr-19's 0.53 at its fourth caption would be it)
            self.steady = self._verdict(True)
        elif self.seen >= _STEADY_MIN and not math.isnan(share) and (
                self._decided or share < _STEADY_SHARE or fits >= _STEADY_MIN):
            # too few heard to tell (NaN) keeps the verdict (one shift until _STEADY_MIN), and
            # the first verdict of one shift needs _STEADY_MIN captions on it: three of four
            # ASR delays within 80 ms of each other (tune asr-13: 1.18 to 1.25 s) read as
            # subtitles and put a stream's first four captions on the offset, 0.5-0.9 s off
            self.steady = self._verdict(share >= _STEADY_SHARE)
        if self.steady or audio_conf < _PLACE_MIN_AUDIO_CONF:
            # (where the sound's offset is not known at all, neither is where its speech
            # lies on the picture's clock: music whose beats read as speech put subtitled
            # clips' last captions 1.9 s off at audio confidence 0.01; tune set)
            for r in self._recent:
                self.placed.pop(r.key, None)
            return
        got = align_captions(caps, ref, delay_us=asr_delay_us, lo_us=max(0.0, lo_us),
                             hi_us=hi_us,
                             time_scale_us=asr_time_scale_us, dur_scale_us=asr_dur_scale_us,
                             heard_us=heard_to)
        for r, p in zip(self._recent, got, strict=True):
            if p is not None and p.conf >= _PLACE_MIN_CONF:
                self.placed[r.key] = (round(p.speech_us), round(min(p.conf, audio_conf), 3))
            else:
                self.placed.pop(r.key, None)
        while len(self.placed) > _PLACED_MEMORY:  # the oldest go first (insertion order)
            del self.placed[next(iter(self.placed))]
