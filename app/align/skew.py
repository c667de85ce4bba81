"""Per-stream clock-skew estimation: onsets on a 10 ms grid, tracked over time (pure).

Audio against the picture: how the sound's level changes (``env``, 10 ms hops)
against the picture's cuts (``change`` of each frame, placed half-way to the
previous frame). Captions against the sound: a caption's start against speech starts;
a caption's offset behind the picture is then its lag behind the sound plus
the sound's behind the picture (captions follow speech, not cuts).

Every ``every_us`` of reference media each modality's :class:`LagTracker`
(``app.align.lag``) takes the newest ``segment_us`` of both signals: their
normalised cross-correlation over the lag band is the likelihood of each lag,
multiplied into a belief that remembers every stretch seen (so one stretch that
matched the wrong cut moves it little) and spreads slowly between updates (the
lag drifts, at most a few ms per second). A stretch with no onset on either
side updates nothing: the estimate is held.

The offset is the belief's peak. The confidence is the belief's mass within
``_NEAR_BINS`` of it (for captions: times how well the recent ones agree), held
under 0.5 while a lag far from it is nearly as likely (periodic content: music's
beats) or just after it jumped, and it falls while the content says nothing.
All were calibrated on the corpus's
tune set (``scripts/bench_align.py --corpus``, docs/benchmarks.md).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from app.align.lag import (
    BIN_US,
    BinRing,
    LagTracker,
    audio_changes,
    cut_strengths,
    frame_cuts,
    match_likelihood,
    peak_times,
    speech_starts,
    xcorr,
)
from schemas.codec import unpack_array
from schemas.features import FeatureRecord

__all__ = ["SkewConfig", "StreamSkew"]


#: The likelihood's scale: log-likelihood per second of compared signal at r = 1.
_KAPPA = 8.0
#: Confidence counts the belief within this many 10 ms bins of the estimate ...
_NEAR_BINS = 3
#: ... above this much of it (confidence 0; 0.5 at a mass of 0.8).
_MASS_FLOOR = 0.6
#: Confidence holds for _HOLD_US after the last event that informed the estimate, then
#: falls with time constant _RECENT_US (content that says nothing is flagged within 2 s).
_HOLD_US = 1_500_000
_RECENT_US = 500_000
#: A caption's lag is known to a few tens of ms at best: its confidence counts the belief
#: within 50 ms (the goal's bound), above a lower floor (it needs several captions) ...
_TEXT_NEAR_BINS = 5
_TEXT_MASS_FLOOR = 0.2
#: ... and holds longer: captions come every few seconds.
_TEXT_HOLD_US = 6_000_000
#: The margin the aligner keeps for a confident estimate covers all but this much of its
#: belief above it (app.align.aligner: the watermark waits for a lag that large).
_MARGIN_TAIL = 0.01
#: How precisely a caption's start follows its speech start, in 10 ms bins (subtitles are
#: placed by hand; ASR captions vary by a few hundred ms: their offset is the typical one).
_CAPTION_SIGMA_BINS = 5.0
#: Sound read around a caption's reach, bins.
_SPEECH_TAIL = 30
#: A stretch informs only if both sides have an event at least this strong: a cut of
#: this mean |thumbnail difference| above the local baseline (0..1), a level change of
#: this many dB above the usual.
_MIN_CUT = 0.02
_MIN_CHANGE_DB = 4.0
#: How far one modality's features may trail another's (media time, us) with no evidence
#: lost: the sound's levels and the frames' changes are kept this much longer than the
#: comparison itself needs. A loaded worker's picture ran several seconds of media behind
#: its sound (issue 29: the live clip test at 4x real time beside other work); the sound
#: the comparison then needed had been overwritten, the estimate went uninformed for 9 s
#: and its confidence fell to 0 there. 30 s is the aligner's own bound on waiting for a
#: slow modality (MMSYNC_MAX_HOLD_MS's default); memory: 16 bytes per 10 ms of sound, about
#: 65 KB per stream.
_TRAIL_US = 30_000_000
#: Periodic content (music's beats, a cut on one of them) fits lags a beat apart almost
#: equally: the belief then holds a rival peak, and the stretches, which overlap and repeat
#: the same beat, make either look surer than it is (music-08 of the corpus's tune set sat
#: a beat, 660 ms, off at confidence 0.9). Confidence stays under 0.5 while the best lag
#: more than _RIVAL_BINS from the estimate is within _RIVAL_NATS (natural log of the
#: belief's odds) of it, and for _JUMPED_US after a confident estimate jumped that far (one
#: peak just overtook another). Chosen on the tune set (docs/benchmarks.md): music's windows
#: at confidence >= 0.5 went from p95 661 to 28 ms, all audio's share of them 87% -> 84%.
_RIVAL_BINS = 15
_RIVAL_NATS = 7.0
_JUMPED_US = 5_000_000


@dataclass(frozen=True, slots=True)
class SkewConfig:
    max_skew_us: int = 1_000_000
    #: how far a caption may trail (or lead) the speech it belongs to, us (ASR captions
    #: come 0.5 to 2 s after the words)
    max_text_skew_us: int = 2_500_000
    #: re-estimate when the stream's media time advanced this much, us.
    every_us: int = 500_000
    #: the stretch of signal each update compares, us.
    segment_us: int = 2_000_000
    reference: str = "image"

    @property
    def band(self) -> int:
        return max(1, math.ceil(self.max_skew_us / BIN_US))

    @property
    def text_band(self) -> int:
        return max(1, math.ceil(self.max_text_skew_us / BIN_US))

    def lag_range(self, modality: str) -> tuple[int, int]:
        """Lags (bins) the estimate searches: +-max_skew, and for captions up to
        max_text_skew behind (ASR captions trail the speech; none leads it by more)."""
        if modality == "text":
            return -self.band, max(self.band, self.text_band)
        return -self.band, self.band


@dataclass(slots=True)
class _Estimate:
    """One modality's tracker and what it last said."""

    tracker: LagTracker
    #: the bin up to which the signals were compared (None: never)
    done_to: int | None = None
    #: the bin the belief was last carried to (predict), for captions: the last one's
    tracked_to: int | None = None
    #: the bin of the last stretch that informed it (None: never)
    informed_at: int | None = None
    offset_us: float = 0.0
    concentration: float = 0.0
    #: whether anything (an informative stretch, or a seed) set the belief
    known: bool = False
    #: whether offset_us holds an estimate the next one should prefer to stay near
    reported: bool = False
    #: captions: how far each recent one's nearest speech start lay from the estimate, us
    residuals: deque[float] = field(default_factory=lambda: deque(maxlen=8))
    #: the bin where the estimate last jumped (moved more than _RIVAL_BINS at once)
    jumped_at: int | None = None


@dataclass(slots=True)
class _Signals:
    """The raw inputs of one stream, for the last horizon of media."""

    frames: deque[tuple[int, float]] = field(default_factory=deque)
    #: caption starts not yet compared with the speech
    captions: deque[int] = field(default_factory=deque)
    newest: dict[str, int] = field(default_factory=dict)


class StreamSkew:
    """Skew of each modality of one stream behind the reference (image)."""

    def __init__(self, cfg: SkewConfig, modalities: tuple[str, ...]) -> None:
        self.cfg = cfg
        self.modalities = modalities
        seg = cfg.segment_us // BIN_US
        self._horizon_us = cfg.segment_us + 2 * cfg.max_text_skew_us + 4 * cfg.every_us
        #: what is kept of each signal behind its newest value, us
        self._keep_us = self._horizon_us + _TRAIL_US
        self._env = BinRing(self._keep_us // BIN_US + seg)
        self._sig = _Signals()
        self._est: dict[str, _Estimate] = {}
        for m in modalities:
            if m == cfg.reference:
                continue
            self._est[m] = _Estimate(LagTracker(*cfg.lag_range(m)))
        self._last_update = -1
        self._first_sound_bin: int | None = None

    # -- input -------------------------------------------------------------
    def observe(self, rec: FeatureRecord) -> None:
        f, sig = rec.feats, self._sig
        end = rec.ts + rec.dur
        if rec.modality == self.cfg.reference:
            if "change" in f:
                sig.frames.append((rec.ts, float(f["change"])))
                while sig.frames and sig.frames[0][0] < rec.ts - self._keep_us:
                    sig.frames.popleft()
        elif rec.modality == "audio" and "env" in f:
            env = unpack_array(f["env"]).astype(np.float64)
            hop = int(f.get("env_hop_us", BIN_US))
            # the chunk's level at each bin centre it covers (chunks do not start on bins)
            t = rec.ts + (np.arange(len(env)) + 0.5) * hop
            # bins whose centre lies in the chunk (its level held flat at the edges)
            first = math.ceil(rec.ts / BIN_US - 0.5)
            last = math.floor((rec.ts + len(env) * hop) / BIN_US - 0.5 - 1e-9)
            if last >= first:
                centres = (np.arange(first, last + 1) + 0.5) * BIN_US
                self._env.put(first, np.interp(centres, t, env))
                if self._first_sound_bin is None or first < self._first_sound_bin:
                    self._first_sound_bin = first
            end = rec.ts + len(env) * hop
        elif rec.modality == "text":
            if float(f.get("caption", 1.0)) > 0:
                sig.captions.append(rec.ts)
                # a stream without sound never compares them: keep only the horizon
                while sig.captions and sig.captions[0] < rec.ts - self._horizon_us:
                    sig.captions.popleft()
        sig.newest[rec.modality] = max(sig.newest.get(rec.modality, -1), end)

    def restore(self, offsets_us: dict[str, int], confidence: dict[str, float]) -> None:
        """Start from what a window reported (a takeover restores the last one's):
        ``offsets_us`` and ``confidence`` as :meth:`offset_us` and :meth:`confidence`
        gave them, every modality against the reference. A caption's own lag is behind
        the sound (:meth:`offset_us` adds the sound's), so the sound's is taken off."""
        if "audio" in offsets_us:
            self.seed("audio", offsets_us["audio"], confidence.get("audio", 0.0))
        if "text" in offsets_us:
            audio = self._est.get("audio")
            behind_sound = offsets_us["text"] - (audio.offset_us if audio is not None else 0.0)
            self.seed("text", round(behind_sound), confidence.get("text", 0.0))

    def seed(self, modality: str, offset_us: int, confidence: float) -> None:
        """Start from an estimate made before: ``offset_us`` is the modality's own lag (for
        captions, behind the sound; :meth:`restore` takes a window's offsets)."""
        est = self._est.get(modality)
        if est is None or est.known:
            return
        floor = _TEXT_MASS_FLOOR if modality == "text" else _MASS_FLOOR
        mass = floor + max(0.0, min(1.0, confidence)) * (1.0 - floor)  # confidence() inverted
        est.tracker.seed(offset_us / BIN_US, sigma_bins=_NEAR_BINS / 3, weight=mass)
        est.offset_us, est.concentration, est.known = float(offset_us), mass, True
        est.reported = True

    # -- estimation --------------------------------------------------------
    def maybe_update(self) -> bool:
        """Re-estimate if the reference's media time moved ``every_us`` since the last time
        (a burst that arrived meanwhile is compared stretch by stretch: :meth:`update`).
        Triggering on the sound's progress too was tried: it moved the held-out panning
        case's caption offset from 19 to 706 ms median (docs/benchmarks.md)."""
        ref = self._sig.newest.get(self.cfg.reference, -1)
        if ref < 0 or ref - self._last_update < self.cfg.every_us:
            return False
        self._last_update = ref
        self.update()
        return True

    def update(self) -> None:
        newest = self._sig.newest
        ref_bin = newest.get(self.cfg.reference, -1) // BIN_US
        audio_bin = newest.get("audio", -1) // BIN_US
        if "audio" in self._est and audio_bin > 0:
            est = self._est["audio"]
            b = min(ref_bin, audio_bin - est.tracker.hi)
            # Signals that arrived in a burst (one modality's features trailing the
            # other's, then catching up) are compared stretch by stretch, every every_us,
            # as if they had come in time: one step over the whole gap would compare only
            # its last segment_us and leave the rest unseen (issue 29).
            every = self.cfg.every_us // BIN_US
            if est.done_to is not None:
                kept = (self._keep_us - self._horizon_us) // BIN_US
                for p in range(max(est.done_to + every, b - kept), b, every):
                    self._step(est, p, self._audio_vs_picture)
            self._step(est, b, self._audio_vs_picture)
        if "text" in self._est and audio_bin > 0:
            self._captions(self._est["text"], audio_bin)

    def _step(self, est: _Estimate, b: int,
              compare: Callable[[int, int, int], tuple[np.ndarray, int] | None]) -> None:
        seg = self.cfg.segment_us // BIN_US
        if b <= 0 or (est.done_to is not None and b <= est.done_to):
            return
        dt = 0.0 if est.done_to is None else (b - est.done_to) * BIN_US / 1e6
        est.done_to = b
        est.tracker.predict(dt)
        got = compare(b - seg, b, est.tracker.hi)
        if got is not None:
            r, newest_event = got
            # the stretches overlap: each second of signal is counted once in all
            est.tracker.update(_KAPPA * r * min(dt, seg * BIN_US / 1e6))
            est.informed_at, est.known = newest_event, True
        if est.known:
            lag = est.tracker.estimate(est.offset_us / BIN_US if est.reported else None)
            # a confident estimate overturned (not an early one settling): peaks competed
            if (est.reported and abs(lag * BIN_US - est.offset_us) > _RIVAL_BINS * BIN_US
                    and est.concentration >= _MASS_FLOOR + 0.5 * (1.0 - _MASS_FLOOR)):
                est.jumped_at = b
            est.reported = True
            est.offset_us = lag * BIN_US
            est.concentration = min(est.tracker.mass_near(lag, _NEAR_BINS),
                                    self._unambiguous(est, lag, b))

    @staticmethod
    def _unambiguous(est: _Estimate, lag: float, b: int) -> float:
        """The most of the belief near ``lag`` that the confidence may count: just under
        what maps to confidence 0.5 while a rival lag is nearly as likely or the estimate
        has just jumped (``_RIVAL_NATS``), all of it otherwise."""
        jumped = est.jumped_at is not None and (b - est.jumped_at) * BIN_US < _JUMPED_US
        rival = est.tracker.rival_margin(lag, _NEAR_BINS, _RIVAL_BINS) < _RIVAL_NATS
        return _MASS_FLOOR + 0.49 * (1.0 - _MASS_FLOOR) if jumped or rival else 1.0

    def _audio_vs_picture(self, a: int, b: int, band: int) -> tuple[np.ndarray, int] | None:
        frames = [(t, c) for t, c in self._sig.frames
                  if (a - 50) * BIN_US <= t < (b + 50) * BIN_US]
        if len(frames) < 3:
            return None
        ts = np.array([t for t, _ in frames], dtype=np.float64)
        change = np.array([c for _, c in frames])
        mids, strength = cut_strengths(ts, change)
        cut = (mids >= a * BIN_US) & (mids < b * BIN_US) & (strength >= _MIN_CUT)
        if not cut.any():
            return None
        env = self._env.get(a - band, b + band)
        if np.isnan(env).mean() > 0.5:
            return None
        changes = audio_changes(env)
        if changes[band:-band].max() < _MIN_CHANGE_DB:
            return None
        return xcorr(frame_cuts(ts, change, a, b), changes, band), int(mids[cut][-1] // BIN_US)

    def _captions(self, est: _Estimate, audio_bin: int) -> None:
        """Each caption once, when the sound it may belong to (up to the band's reach after
        it) has arrived: the likelihood that it follows one of the speech starts there."""
        tr = est.tracker
        caps = self._sig.captions
        while caps and caps[0] // BIN_US - tr.lo + _SPEECH_TAIL <= audio_bin:
            c = caps.popleft()
            first = c // BIN_US - tr.hi - _SPEECH_TAIL
            env = self._env.get(first, c // BIN_US - tr.lo + _SPEECH_TAIL)
            if np.isnan(env).mean() > 0.5:  # the sound around it is missing: no evidence
                continue
            starts = peak_times(speech_starts(env), first)
            if not len(starts):
                continue
            cb = c // BIN_US
            if est.tracked_to is not None:
                tr.predict(max(0, cb - est.tracked_to) * BIN_US / 1e6)
            est.tracked_to = cb
            tr.update(match_likelihood(c, starts, tr.lags, _CAPTION_SIGMA_BINS))
            est.informed_at, est.known = cb, True
            lag = tr.estimate(est.offset_us / BIN_US if est.reported else None)
            est.reported = True
            est.offset_us = lag * BIN_US
            est.residuals.append(float(np.min(np.abs(c - starts - est.offset_us))))
            # the belief's mass near its peak, times how well the recent captions agree
            # with it (their median distance to it: full up to 30 ms, none from 100 ms):
            # ASR captions, each late by its own delay, concentrate the belief without
            # agreeing (measured on the tune set: confident and 350 ms off)
            spread = float(np.median(est.residuals))
            agree = min(1.0, max(0.0, 1.0 - (spread - 30_000) / 70_000))
            est.concentration = tr.mass_near(lag, _TEXT_NEAR_BINS) * agree
        # every caption before this has been compared: confidence ages from here
        est.done_to = max(est.done_to or 0, audio_bin + tr.lo - _SPEECH_TAIL)

    # -- for per-caption alignment (app.align.captions) ----------------------
    def sound_level(self, a_us: int, b_us: int, *, whole: bool = False
                    ) -> tuple[np.ndarray, int]:
        """The sound's level, dB per 10 ms bin (NaN where unknown), over ``a_us``..``b_us`` on
        its own clock, and the first bin. ``whole``: all the ring holds (``_TRAIL_US`` more
        than the horizon), for a stream's first captions."""
        a = a_us // BIN_US
        env = self._env.get(a, max(a, b_us // BIN_US))
        # The captions' placement reads only the last horizon of sound (what this ring
        # held before it kept _TRAIL_US more for a trailing picture): older bins read as
        # unknown. Reading older sound placed stale captions on it (held-out subtitles
        # p95 48 -> 684 ms on the corpus). A stream's first captions are the exception
        # (``whole``): their windows wait for the fourth caption, up to 20 s, and by then
        # the speech of the first had left the horizon (tune asr-05: its first caption
        # 1.9 s off; asr-14: its speech's start cut, 0.7 s off at confidence 0.7).
        oldest = (self._sig.newest.get("audio", -1) // BIN_US
                  - (self._horizon_us + self.cfg.segment_us) // BIN_US)
        if oldest > a and not whole:
            env[: oldest - a] = np.nan
        return env, a

    @property
    def first_sound_bin(self) -> int | None:
        """The first 10 ms bin of the stream's sound (its own clock); None before any."""
        return self._first_sound_bin

    def caption_lag_us(self) -> float:
        """The captions' estimated lag behind the sound (not the picture), us."""
        est = self._est.get("text")
        return est.offset_us if est is not None else 0.0

    def newest(self, modality: str) -> int:
        """The newest raw end time seen of ``modality``, us (-1: none)."""
        return self._sig.newest.get(modality, -1)

    # -- output ------------------------------------------------------------
    def offset_us(self, modality: str) -> int:
        est = self._est.get(modality)
        if est is None:
            return 0
        if modality == "text":
            audio = self._est.get("audio")
            return round(est.offset_us + (audio.offset_us if audio is not None else 0.0))
        return round(est.offset_us)

    def uncertainty_us(self, modality: str) -> int:
        """How much larger than :meth:`offset_us` the modality's offset may yet be found,
        us: its belief's extent above the estimate, all but ``_MARGIN_TAIL`` of it (for
        captions, their own lag's and the sound's, added). Only this side matters to the
        watermark: a larger offset moves the modality's records to earlier windows."""
        est = self._est.get(modality)
        if est is None:
            return 0
        up = est.tracker.above(est.offset_us / BIN_US, _MARGIN_TAIL) * BIN_US
        audio = self._est.get("audio")
        if modality == "text" and audio is not None:
            up += audio.tracker.above(audio.offset_us / BIN_US, _MARGIN_TAIL) * BIN_US
        return round(up)

    def confidence(self, modality: str, *, recent: bool = True) -> float:
        """How sure the offset is, 0..1 (0.5: calibrated on the corpus as "right"). With
        ``recent`` (what windows report) it falls while the content says nothing; without,
        it is the belief's concentration alone (the belief itself widens with the time
        since it was informed, as much as the lag may drift)."""
        if modality == self.cfg.reference:
            return 1.0
        est = self._est.get(modality)
        if est is None or not est.known:
            return 0.0
        # the belief's mass near the estimate, rescaled so that 0.5 means "right": on the
        # corpus's tune set a mass under about 0.8 was as often a beat off as not
        floor = _TEXT_MASS_FLOOR if modality == "text" else _MASS_FLOOR
        conf = max(0.0, (est.concentration - floor) / (1.0 - floor))
        if recent and est.informed_at is not None and est.done_to is not None:
            hold = _TEXT_HOLD_US if modality == "text" else _HOLD_US
            quiet_us = (est.done_to - est.informed_at) * BIN_US - hold
            if quiet_us > 0:
                conf *= math.exp(-quiet_us / _RECENT_US)
        if modality == "text" and "audio" in self._est:
            conf = min(conf, self.confidence("audio", recent=recent))
        return round(min(1.0, max(0.0, conf)), 3)

