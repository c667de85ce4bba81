"""A deterministic load mix for benchmarks: N live streams with repeated content and bursts.

Each stream is a run of scenes (about one per ``caption_every_s``). At every
scene cut the picture changes, a sound starts and a caption appears, so the
three modalities co-occur the way the aligner's skew estimate expects. A
scene is either *repeated* content (an ad card, a jingle: exactly the same
frame bytes, audio chunks and caption as elsewhere, drawn from a pool with a
Zipf(``zipf_s``) skew, so a content cache has something to hit) or *live*
(a pool background with a large moving block: every frame distinct, a voiced
burst then noise). Captions are drawn from a Zipf pool in both cases, mostly
Chinese (jieba segments them).

Bursts: every ``burst_every_s`` of media, for ``burst_s``, frames and captions
come ``burst_x`` times as often (audio is continuous media: it stays at one
chunk per ``audio_chunk_ms``).

Every record carries a ``trace_id`` (``tag/stream/modality+seq``), so a
benchmark can join an output window's ``trace_ids`` to each input's send
time. :func:`mix` is pure and deterministic for a spec.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np
import simplejpeg
from PIL import Image, ImageDraw

from schemas.events import AudioChunk, Event, FrameEvent, TextEvent, encode_event

__all__ = ["CAPTIONS", "Item", "MixSpec", "TERM_CAPTIONS", "mix", "scaled", "zipf_weights"]

#: The caption pool, most frequent first (Zipf rank order), about 3/4 Chinese.
CAPTIONS = (
    "欢迎来到直播间", "今天我们看看新产品", "这个价格非常优惠", "大家好请点赞关注",
    "hello and welcome back", "谢谢大家的支持", "限时抢购马上开始", "主播现在试用一下",
    "look at this new camera", "库存不多了赶紧下单", "警方提醒市民注意电话诈骗",
    "天气预报说下午会有大雨",
    "the sound is a little late", "我们明天早上八点出发去机场", "这部电影的音乐非常好听",
    "please keep your tickets ready", "今天的新闻发布会介绍了新产品", "关注主播不迷路",
    "a new bridge opens downtown next week", "包邮到家七天无理由退货", "评论区抽三位送礼物",
    "the match ended in a draw", "点击下方链接购买", "明天晚上八点继续直播",
)


#: Captions of the pool that carry the bench's extra alert terms (scripts/benchlib/alerts.py:
#: 抢购, 下单): what a ``term_share`` of the captions is drawn from.
TERM_CAPTIONS = ("限时抢购马上开始", "库存不多了赶紧下单")


@dataclass(frozen=True)
class MixSpec:
    streams: int = 8
    seconds: float = 20.0
    fps: float = 5.0
    audio_chunk_ms: int = 100
    sr: int = 16_000
    #: mean seconds between scene cuts (one caption per cut).
    caption_every_s: float = 2.0
    zipf_s: float = 1.0
    #: distinct ad cards / jingles in the repeat pool.
    pool: int = 16
    #: share of scenes that are repeated content (the rest is live).
    repeat_share: float = 0.5
    burst_every_s: float = 10.0
    burst_s: float = 2.0
    burst_x: float = 3.0
    width: int = 320
    height: int = 180
    seed: int = 1
    #: stream ids are ``f"{prefix}-{i}"``; trace ids start with ``tag``.
    prefix: str = "load"
    tag: str = "load"
    start_us: int = 1_000_000_000
    #: added to every ``seq``: a later mix of the same streams must not reuse one
    #: (the aligner drops a repeated seq as a duplicate).
    seq_base: int = 0
    #: every frame random noise (nothing repeats, no near-duplicate, no cache hit: the
    #: image models run on each one), instead of the scenes' cards and live frames.
    noise_frames: bool = False
    #: this share of the captions is drawn from TERM_CAPTIONS (each alerts), the rest from
    #: the Zipf pool; 0: all from the pool (and the draws as before it existed).
    term_share: float = 0.0


@dataclass(frozen=True, slots=True)
class Item:
    """One input record: its media offset from the mix's start (s), topic modality,
    key, encoded value and trace id."""
    t: float
    modality: str
    key: bytes
    value: bytes
    trace_id: str


def zipf_weights(n: int, s: float) -> np.ndarray:
    w = 1.0 / np.arange(1, n + 1) ** s
    return w / w.sum()


@lru_cache(maxsize=8)
def _pool_images(n: int, w: int, h: int, seed: int) -> tuple[np.ndarray, ...]:
    """Ad cards: a colour field, a gradient, bars and a banner (real-ish JPEG content)."""
    out = []
    for k in range(n):
        rng = np.random.default_rng(seed * 1000 + k)
        img = Image.new("RGB", (w, h), tuple(int(c) for c in rng.integers(40, 230, 3)))
        d = ImageDraw.Draw(img)
        for j in range(8):
            bh = int(rng.integers(h // 8, h - 10))
            x0 = 8 + j * (w - 16) // 8
            d.rectangle([x0, h - bh, x0 + (w - 16) // 10, h - 4],
                        fill=tuple(int(c) for c in rng.integers(0, 255, 3)))
        d.rectangle([0, 0, w, h // 6], fill=tuple(int(c) for c in rng.integers(0, 255, 3)))
        arr = np.asarray(img).astype(np.int16)
        arr = arr + (np.linspace(-30, 30, w)[None, :, None]).astype(np.int16)
        out.append(np.clip(arr, 0, 255).astype(np.uint8))
    return tuple(out)


@lru_cache(maxsize=8)
def _pool_jpegs(n: int, w: int, h: int, seed: int) -> tuple[bytes, ...]:
    return tuple(simplejpeg.encode_jpeg(im, quality=85) for im in _pool_images(n, w, h, seed))


@lru_cache(maxsize=8)
def _jingles(n: int, sr: int, chunk_ms: int, seconds: float, seed: int
             ) -> tuple[tuple[bytes, ...], ...]:
    """Short tunes cut into chunks once: a repeated jingle repeats its chunks' bytes."""
    per = sr * chunk_ms // 1000
    chunks = int(seconds * 1000 // chunk_ms)
    out = []
    for k in range(n):
        rng = np.random.default_rng(seed * 77 + k)
        notes = rng.uniform(220, 880, 4)
        t = np.arange(per * chunks) / sr
        f = notes[np.minimum((t * 4 / seconds * len(notes) / 4).astype(int), len(notes) - 1)]
        x = 0.25 * np.sin(2 * np.pi * f * t) * (0.6 + 0.4 * np.sin(2 * np.pi * 2 * t))
        pcm = (np.clip(x, -1, 1) * 32767).astype("<i2")
        out.append(tuple(pcm[i * per:(i + 1) * per].tobytes() for i in range(chunks)))
    return tuple(out)


def _in_burst(spec: MixSpec, t: float) -> bool:
    return spec.burst_every_s > 0 and (t % spec.burst_every_s) >= spec.burst_every_s - spec.burst_s


def _live_frame(bg: np.ndarray, i: int, rng_off: int) -> bytes:
    h, w = bg.shape[:2]
    img = bg.copy()
    bw, bh = w // 3, h // 2
    x = (rng_off * 37 + i * w // 9) % (w - bw)
    y = (rng_off * 11 + i * h // 7) % (h - bh)
    img[y:y + bh, x:x + bw] = 255 - img[y:y + bh, x:x + bw]
    return simplejpeg.encode_jpeg(img, quality=85)


def _stream(spec: MixSpec, idx: int) -> list[tuple[float, Event]]:
    rng = np.random.default_rng(spec.seed * 7919 + idx)
    sid = f"{spec.prefix}-{idx}"
    sb = spec.seq_base
    pw = zipf_weights(spec.pool, spec.zipf_s)
    cw = zipf_weights(len(CAPTIONS), spec.zipf_s)
    imgs = _pool_images(spec.pool, spec.width, spec.height, spec.seed)
    jpegs = _pool_jpegs(spec.pool, spec.width, spec.height, spec.seed)
    jingles = _jingles(spec.pool, spec.sr, spec.audio_chunk_ms, 2.0, spec.seed)
    # scenes: (start, repeated?, pool index)
    scenes: list[tuple[float, bool, int]] = []
    t = float(rng.uniform(0, 0.5))
    while t < spec.seconds:
        scenes.append((t, bool(rng.random() < spec.repeat_share), int(rng.choice(spec.pool, p=pw))))
        t += max(0.8, float(rng.exponential(spec.caption_every_s)))

    def scene_at(tt: float) -> int:
        k = 0
        while k + 1 < len(scenes) and scenes[k + 1][0] <= tt:
            k += 1
        return k

    evs: list[tuple[float, Event]] = []
    # frames: at fps, burst_x times as often inside a burst
    t, seq = 0.0, 0
    while t < spec.seconds:
        k = scene_at(t)
        start, rep, p = scenes[k] if scenes and scenes[0][0] <= t else (0.0, True, 0)
        if spec.noise_frames:
            data = simplejpeg.encode_jpeg(
                rng.integers(0, 256, (spec.height, spec.width, 3), dtype=np.uint8), quality=85)
        else:
            data = jpegs[p] if rep else _live_frame(imgs[p], seq, idx)
        evs.append((t, FrameEvent(stream_id=sid, ts=spec.start_us + int(t * 1e6), seq=sb + seq,
                                  data=data, fmt="jpeg", trace_id=f"{spec.tag}/{idx}/i{seq}")))
        seq += 1
        t += 1.0 / (spec.fps * (spec.burst_x if _in_burst(spec, t) else 1.0))
    # audio: continuous chunks; a jingle's chunks (exact bytes) in repeated scenes,
    # a voiced burst then noise in live ones
    hop = spec.audio_chunk_ms / 1000
    n = spec.sr * spec.audio_chunk_ms // 1000
    for i in range(int(spec.seconds / hop)):
        t0 = i * hop
        k = scene_at(t0)
        if scenes and scenes[0][0] <= t0:
            start, rep, p = scenes[k]
        else:
            start, rep, p = 0.0, False, 0
        j = int((t0 - start) / hop)
        if rep and j < len(jingles[p]):
            data = jingles[p][j]
        else:
            tt = t0 + np.arange(n) / spec.sr
            x = rng.normal(0, 0.004, n)
            if t0 - start < 0.4:
                f0 = 140 + 40 * np.sin(2 * np.pi * 3 * (tt - start))
                x = x + 0.3 * (np.sin(2 * np.pi * f0 * tt) + 0.5 * np.sin(4 * np.pi * f0 * tt))
            data = (np.clip(x, -1, 1) * 32767).astype("<i2").tobytes()
        evs.append((t0, AudioChunk(stream_id=sid, ts=spec.start_us + int(t0 * 1e6), seq=sb + i,
                                   data=data, sr=spec.sr, ch=1,
                                   trace_id=f"{spec.tag}/{idx}/a{i}")))
    # captions: one at each scene cut, plus extra chat lines inside bursts
    times = [s for s, _, _ in scenes]
    if spec.burst_x > 1 and spec.burst_every_s > 0:
        b = spec.burst_every_s - spec.burst_s
        while b < spec.seconds:
            extra = int(round(spec.burst_s / spec.caption_every_s * (spec.burst_x - 1)))
            times += [b + (e + 0.5) * spec.burst_s / max(extra, 1) for e in range(extra)]
            b += spec.burst_every_s
    for seq, tc in enumerate(sorted(x for x in times if x < spec.seconds)):
        if spec.term_share > 0 and rng.random() < spec.term_share:
            text = TERM_CAPTIONS[int(rng.integers(len(TERM_CAPTIONS)))]
        else:
            text = CAPTIONS[int(rng.choice(len(CAPTIONS), p=cw))]
        evs.append((tc, TextEvent(stream_id=sid, ts=spec.start_us + int(tc * 1e6), seq=sb + seq,
                                  text=text, dur=1_500_000,
                                  lang="en" if text.isascii() else "zh",
                                  trace_id=f"{spec.tag}/{idx}/t{seq}")))
    return evs


def mix(spec: MixSpec) -> list[Item]:
    """Every record of every stream, in media-time order (ties by stream)."""
    rows: list[tuple[float, int, Event]] = []
    for i in range(spec.streams):
        rows += [(t, i, e) for t, e in _stream(spec, i)]
    rows.sort(key=lambda r: (r[0], r[1]))
    return [Item(t, e.modality, e.stream_id.encode(), encode_event(e), e.trace_id or "")
            for t, _, e in rows]


def scaled(spec: MixSpec, rate: float, tag: str, **kw: object) -> MixSpec:
    """The same mix with ``rate`` times as many streams (at least one), tagged ``tag``."""
    return replace(spec, streams=max(1, round(spec.streams * rate)), tag=tag, **kw)  # type: ignore[arg-type]

