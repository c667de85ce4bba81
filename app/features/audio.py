"""Audio features: 16 kHz resampling, log-mel summary and Silero speech probability.

Every value is per 50 ms hop, on the same grid as the light ``rms`` signal:
``speech`` (float32 [hops]) and ``mel`` (float16 [hops, 64], the mean log-mel
power of the 10 ms frames centred in that hop). Silero VAD is stateful: each
stream keeps its LSTM state, its 64-sample context and the samples not yet
filling a 512-sample (32 ms) window, so chunk boundaries do not reset it. One
ONNX call per stream per batch runs all of that stream's windows (the
package's "sequence" model, bit-exact with the streaming one).
"""

from __future__ import annotations

import importlib.util
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from app.cache.features import FeatureMemo
from app.features.degrade import Level
from app.features.light import AUDIO_HOP_US, audio_signals, pcm_to_mono
from app.features.onnx import ModelRuntime
from app.lru import LRU
from schemas.codec import pack_array
from schemas.events import AudioChunk

__all__ = ["MEL_BINS", "SR", "AudioExtractor", "LogMel", "resample", "silero_model_path"]

#: The models' sample rate, Hz.
SR = 16_000
MEL_BINS = 64
_WIN = 400  # 25 ms
_STEP = 160  # 10 ms
_NFFT = 512
_HOP16 = SR * AUDIO_HOP_US // 1_000_000  # 800 samples per 50 ms hop
_VAD_WIN = 512
_VAD_CTX = 64
_MAX_STREAMS = 4096


def silero_model_path() -> Path:
    """The sequence ONNX model inside ``silero-vad`` (found without importing
    the package, whose ``__init__`` imports torch)."""
    spec = importlib.util.find_spec("silero_vad")
    if spec is None or spec.origin is None:
        raise RuntimeError("silero-vad is not installed")
    return Path(spec.origin).parent / "data" / "silero_vad_16k_sequence.onnx"


def resample(x: np.ndarray, sr: int) -> np.ndarray:
    """Mono float32 at ``sr`` to 16 kHz with libsoxr (HQ). Each chunk is resampled
    on its own: the filter's edge effect is under a millisecond at each end."""
    if sr == SR or len(x) == 0:
        return x.astype(np.float32, copy=False)
    import soxr

    return np.asarray(soxr.resample(x, sr, SR, quality="HQ"), dtype=np.float32)


def _mel_filterbank(n_mels: int = MEL_BINS, n_fft: int = _NFFT, sr: int = SR,
                    fmin: float = 60.0, fmax: float = 7600.0) -> np.ndarray:
    """Triangular HTK-mel filters, [n_mels, n_fft // 2 + 1]."""
    def mel(f: np.ndarray) -> np.ndarray:
        return 2595.0 * np.log10(1.0 + f / 700.0)

    def hz(m: np.ndarray) -> np.ndarray:
        return 700.0 * (10.0 ** (m / 2595.0) - 1.0)

    edges = hz(np.linspace(mel(np.array(fmin)), mel(np.array(fmax)), n_mels + 2))
    bins = np.fft.rfftfreq(n_fft, 1.0 / sr)
    lo, mid, hi = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    fb = np.maximum(0.0, np.minimum((bins - lo) / (mid - lo), (hi - bins) / (hi - mid)))
    return fb.astype(np.float32)


class LogMel:
    """Log-mel power per 50 ms hop: 25 ms Hann frames every 10 ms, averaged per hop."""

    def __init__(self) -> None:
        self._fb = _mel_filterbank()
        self._window = np.hanning(_WIN).astype(np.float32)

    def __call__(self, x16: np.ndarray, hops: int) -> np.ndarray:
        pad = np.zeros(len(x16) + _WIN, dtype=np.float32)
        pad[_WIN // 2: _WIN // 2 + len(x16)] = x16
        n = len(x16) // _STEP + 1
        idx = np.arange(n)[:, None] * _STEP + np.arange(_WIN)[None, :]
        spec = np.abs(np.fft.rfft(pad[idx] * self._window, n=_NFFT, axis=1)) ** 2
        logmel = np.log(spec.astype(np.float32) @ self._fb.T + 1e-6)
        hop_of = np.minimum(np.arange(n) * _STEP // _HOP16, hops - 1)
        sums = np.zeros((hops, MEL_BINS), dtype=np.float32)
        np.add.at(sums, hop_of, logmel)
        counts = np.bincount(hop_of, minlength=hops).astype(np.float32)
        out = sums / np.maximum(counts, 1)[:, None]
        for h in np.flatnonzero(counts == 0):  # only when rounding leaves a hop empty
            out[h] = out[h - 1] if h else np.log(1e-6)
        return out


@dataclass(slots=True)
class _VadState:
    h: np.ndarray = field(default_factory=lambda: np.zeros((1, 1, 128), np.float32))
    c: np.ndarray = field(default_factory=lambda: np.zeros((1, 1, 128), np.float32))
    context: np.ndarray = field(default_factory=lambda: np.zeros(_VAD_CTX, np.float32))
    pending: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    last_prob: float = 0.0


class AudioExtractor:
    """Audio features for a batch; keeps each stream's VAD state (bounded LRU)."""

    #: What a cached mel depends on besides the chunk's bytes, rate and channels.
    version = f"mel1|{MEL_BINS}|{_WIN}/{_STEP}/{_NFFT}"

    def __init__(self, rt: ModelRuntime, cache: FeatureMemo | None = None) -> None:
        self._rt = rt
        self._cache = cache
        self._mel = LogMel()
        self._vad: Any = None
        self._states: LRU[str, _VadState] = LRU(_MAX_STREAMS)
        self.load_s: dict[str, float] = {}

    def set_level(self, level: Level) -> None:
        """Audio has no model worth dropping under load (Silero costs about 1 ms per chunk)."""

    def load(self) -> None:
        if self._vad is None:
            t0 = time.perf_counter()
            # The LSTM is tiny: a GPU launch costs more than it saves. CPU always.
            self._vad = self._rt.cpu_session(silero_model_path())
            self.load_s["silero_vad"] = time.perf_counter() - t0

    def _state(self, stream: str) -> _VadState:
        return self._states.get_or_create(stream, _VadState)

    def speech(self, stream: str, chunks: list[np.ndarray], hops: list[int]) -> list[np.ndarray]:
        """P(speech) per 50 ms hop for consecutive 16 kHz chunks of one stream."""
        self.load()
        st = self._state(stream)
        buf = np.concatenate([st.pending, *chunks]).astype(np.float32, copy=False)
        nwin = len(buf) // _VAD_WIN
        if nwin:
            frames = buf[: nwin * _VAD_WIN].reshape(nwin, _VAD_WIN)
            ctx = np.empty((nwin, _VAD_CTX), dtype=np.float32)
            ctx[0] = st.context
            ctx[1:] = frames[:-1, -_VAD_CTX:]
            probs, st.h, st.c = self._vad.run(
                ["speech_probs", "hn", "cn"],
                {"input": np.concatenate([ctx, frames], axis=1), "h": st.h, "c": st.c})
            probs = np.asarray(probs, dtype=np.float32).reshape(-1)
            st.context = frames[-1, -_VAD_CTX:].copy()
            st.last_prob = float(probs[-1])
            timeline = np.repeat(probs, _VAD_WIN)
        else:
            timeline = np.zeros(0, np.float32)
        tail = len(buf) - len(timeline)
        # Samples not yet in a full window carry the latest probability (<= 32 ms late).
        timeline = np.concatenate([timeline, np.full(tail, st.last_prob, np.float32)])
        st.pending = buf[nwin * _VAD_WIN:].copy()
        out = []
        off = len(buf) - sum(len(c) for c in chunks)
        for ch, n in zip(chunks, hops, strict=True):
            seg = timeline[off: off + len(ch)]
            off += len(ch)
            sp = np.empty(n, dtype=np.float32)
            for h in range(n):
                part = seg[h * _HOP16: (h + 1) * _HOP16]
                sp[h] = part.mean() if len(part) else (seg[-1] if len(seg) else st.last_prob)
            out.append(sp)
        return out

    def run(self, events: list[AudioChunk]) -> list[dict[str, Any] | Exception]:
        self.load()
        feats: list[dict[str, Any]] = []
        x16s: list[np.ndarray] = []
        hops: list[int] = []
        for ev in events:
            mono = pcm_to_mono(ev.data, ev.ch)
            light = audio_signals(ev, mono)
            n = int(light["rms"]["shape"][0])
            x16 = resample(mono, ev.sr)  # always: the VAD below needs every chunk
            # Only the mel is content-pure (speech depends on the stream's history).
            key = hit = None
            if self._cache is not None:
                key = self._cache.key("audio", b"%d/%d/" % (ev.sr, ev.ch) + ev.data,
                                      self.version)
                hit = self._cache.get("audio", key)
            if hit is not None and "mel" in hit:
                light["mel"] = hit["mel"]
            else:
                light["mel"] = pack_array(self._mel(x16, n).astype(np.float16))
                if self._cache is not None and key is not None:
                    self._cache.put("audio", key, {"mel": light["mel"]})
            feats.append(light)
            x16s.append(x16)
            hops.append(n)
        by_stream: dict[str, list[int]] = {}
        for i, ev in enumerate(events):
            by_stream.setdefault(ev.stream_id, []).append(i)
        for stream, idx in by_stream.items():
            for i, sp in zip(idx, self.speech(stream, [x16s[i] for i in idx],
                                              [hops[i] for i in idx]), strict=True):
                feats[i]["speech"] = pack_array(sp)
        return list(feats)
