"""A real media file (video, audio, subtitles) as contract input records, with PyAV.

Each modality is decoded by its own lazy generator (a container opened per
modality, so nothing but the current frame and audio buffer sits in memory),
and the three are merged in ``ts`` order, so the aligner sees the arrival order
of a live source. ``ts = start_us + (pts - container start)``: every modality
keeps the file's own presentation times, relative to one origin.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import av
import numpy as np
import simplejpeg

from app.clients.produce import Record, parse_srt
from app.errors import MmsyncError
from schemas.events import AudioChunk, Event, FrameEvent, TextEvent, encode_event

__all__ = ["MediaError", "MediaInfo", "TimedRecord", "audio_events", "frame_events", "pick_frame",
           "probe", "subtitle_events", "video_records"]

#: The contract's audio rate range (AudioChunk ``sr``).
_SR_MIN, _SR_MAX = 8000, 48000
_MAX_CH = 8
_MAX_TRACE_ID = 128

#: (ts, record): what the per-modality generators yield, merged by ts.
TimedRecord = tuple[int, Record]


class MediaError(MmsyncError):
    """The file cannot be read as media (missing, not a container, no usable stream)."""


@dataclass(frozen=True)
class MediaInfo:
    path: Path
    #: microseconds, 0 when the container does not say.
    duration_us: int
    has_video: bool
    has_audio: bool
    #: text subtitle streams in the container.
    subtitle_streams: int
    video_fps: float | None
    audio_rate: int | None
    audio_channels: int | None

    def estimate(self, fps: float | None, chunk_ms: int) -> int:
        """About how many frame and audio records the file gives (for a progress bar)."""
        secs = self.duration_us / 1e6
        n = 0
        if self.has_video:
            rate = min(fps, self.video_fps or fps) if fps else (self.video_fps or 25.0)
            n += math.ceil(secs * rate)
        if self.has_audio:
            n += math.ceil(secs * 1000 / chunk_ms)
        return n


def _open(path: Path) -> Any:
    try:
        return av.open(str(path))
    except FileNotFoundError:
        raise MediaError(f"{path}: no such file") from None
    except (av.FFmpegError, OSError, UnicodeDecodeError) as exc:
        raise MediaError(f"{path}: not a readable media file ({exc})") from None


def probe(path: Path) -> MediaInfo:
    """What the file holds; a :class:`MediaError` if it is not media with a usable stream."""
    with _open(path) as c:
        v = c.streams.video[0] if c.streams.video else None
        a = c.streams.audio[0] if c.streams.audio else None
        subs = sum(1 for s in c.streams.subtitles if _is_text_subtitle(s))
        if v is None and a is None and not subs:
            raise MediaError(f"{path}: no video, audio or text subtitle stream")
        rate = (v.average_rate or v.base_rate) if v is not None else None
        return MediaInfo(
            path=path, duration_us=max(0, int(c.duration or 0)), has_video=v is not None,
            has_audio=a is not None, subtitle_streams=subs,
            video_fps=float(rate) if rate else None,
            audio_rate=a.codec_context.sample_rate if a is not None else None,
            audio_channels=a.codec_context.channels if a is not None else None,
        )


def _is_text_subtitle(stream: Any) -> bool:
    name = stream.codec_context.name if stream.codec_context else ""
    return name in ("subrip", "srt", "ass", "ssa", "mov_text", "webvtt", "text")


def _origin_us(c: Any) -> int:
    """The container's start time (AV_TIME_BASE = microseconds): pts 'zero' of every stream."""
    return int(c.start_time or 0)


def _pts_us(pts: int | None, time_base: Any) -> int | None:
    if pts is None or time_base is None:
        return None
    return int(pts * time_base.numerator * 1_000_000 // time_base.denominator)


def _trace_id(stream_id: str, modality: str, seq: int) -> str:
    tail = f":{modality}:{seq}"
    return stream_id[: _MAX_TRACE_ID - len(tail)] + tail


def _rec(ev: Event) -> TimedRecord:
    return ev.ts, (ev.modality, ev.stream_id.encode(), encode_event(ev))


def pick_frame(t_us: int, fps: float | None, last_slot: int | None) -> int | None:
    """The output slot a frame at ``t_us`` (from the first frame) fills, or None to drop it.

    Frames are resampled by presentation time: time is cut into slots of
    ``1/fps`` and the first frame of each slot is kept (a source slower than
    ``fps`` keeps every frame; nothing is duplicated). ``fps`` None or 0 keeps all.
    """
    if not fps:
        return (last_slot + 1) if last_slot is not None else 0
    slot = int(t_us * fps // 1_000_000)
    return slot if last_slot is None or slot > last_slot else None


def _scaled(w: int, h: int, max_side: int) -> tuple[int, int]:
    if max_side <= 0 or max(w, h) <= max_side:
        return w, h
    s = max_side / max(w, h)
    return max(1, round(w * s)), max(1, round(h * s))


def frame_events(path: Path, stream_id: str, start_us: int, *, fps: float | None = 10.0,
                 max_side: int = 640, quality: int = 85) -> Iterator[TimedRecord]:
    """The video stream's frames, resampled to ``fps``, as JPEG FrameEvents."""
    with _open(path) as c:
        if not c.streams.video:
            return
        stream = c.streams.video[0]
        stream.thread_type = "AUTO"
        origin, first, slot, seq = _origin_us(c), None, None, 0
        try:
            for i, frame in enumerate(c.decode(stream)):
                t = _pts_us(frame.pts, frame.time_base or stream.time_base)
                if t is None:  # no timestamps at all: assume the nominal rate
                    rate = float(stream.average_rate or 25)
                    t = origin + int(i * 1_000_000 / rate)
                first = t if first is None else first
                picked = pick_frame(t - first, fps, slot)
                if picked is None:
                    continue
                slot = picked
                w, h = _scaled(frame.width, frame.height, max_side)
                rgb = frame.reformat(width=w, height=h, format="rgb24").to_ndarray()
                data = simplejpeg.encode_jpeg(np.ascontiguousarray(rgb), quality=quality,
                                              colorspace="RGB")
                ts = max(0, start_us + t - origin)
                yield _rec(FrameEvent(stream_id=stream_id, ts=ts, seq=seq, data=data, fmt="jpeg",
                                      trace_id=_trace_id(stream_id, "image", seq)))
                seq += 1
        except av.FFmpegError as exc:
            raise MediaError(f"{path}: video decoding failed after {seq} frames ({exc})") from None


def audio_events(path: Path, stream_id: str, start_us: int, *, chunk_ms: int = 100
                 ) -> Iterator[TimedRecord]:
    """The audio stream as s16 interleaved AudioChunks of ``chunk_ms`` at the source rate.

    The rate is clamped to the contract's 8000..48000 Hz and more than 8
    channels are downmixed to stereo. A chunk's ts follows from the samples
    before it, re-anchored on the frame's pts when the file has a gap.
    """
    with _open(path) as c:
        if not c.streams.audio:
            return
        stream = c.streams.audio[0]
        cc = stream.codec_context
        sr = min(_SR_MAX, max(_SR_MIN, cc.sample_rate or 16000))
        ch = cc.channels or 1
        layout = cc.layout.name if 1 <= ch <= _MAX_CH else "stereo"
        ch = ch if 1 <= ch <= _MAX_CH else 2
        resampler = av.AudioResampler(format="s16", layout=layout, rate=sr)
        per_chunk = max(1, sr * chunk_ms // 1000)  # sample frames per chunk
        bpf = 2 * ch  # bytes per sample frame
        origin = _origin_us(c)
        buf = bytearray()
        # ts = anchor + done samples at sr (computed from the total, so no rounding drifts)
        anchor: int | None = None
        done = 0
        seq = 0

        def chunks(final: bool) -> Iterator[TimedRecord]:
            nonlocal done, seq
            size = per_chunk * bpf
            while len(buf) >= size or (final and buf):
                data = bytes(buf[:size])
                del buf[:size]
                assert anchor is not None
                ts = anchor + done * 1_000_000 // sr
                yield _rec(AudioChunk(stream_id=stream_id, ts=max(0, ts), seq=seq, data=data,
                                      sr=sr, ch=ch,
                                      trace_id=_trace_id(stream_id, "audio", seq)))
                seq += 1
                done += len(data) // bpf

        def feed(frames: list[Any], pts_us: int | None) -> Iterator[TimedRecord]:
            nonlocal anchor, done
            for out in frames:
                pcm = out.to_ndarray().tobytes()  # packed s16: shape (1, samples * ch)
                if not pcm:
                    continue
                expected = (None if anchor is None
                            else anchor + (done + len(buf) // bpf) * 1_000_000 // sr)
                if pts_us is not None:
                    here = start_us + pts_us - origin
                    if expected is None or abs(here - expected) > chunk_ms * 1000:
                        # first audio, or a gap/jump in the file: flush, start again here
                        yield from chunks(final=True)
                        anchor, done = here, 0
                pts_us = None  # later frames of one resample() follow on
                if anchor is None:
                    anchor = start_us
                buf.extend(pcm)
                yield from chunks(final=False)

        try:
            for frame in c.decode(stream):
                t = _pts_us(frame.pts, frame.time_base or stream.time_base)
                yield from feed(resampler.resample(frame), t)
            yield from feed(resampler.resample(None), None)
        except av.FFmpegError as exc:
            raise MediaError(f"{path}: audio decoding failed after {seq} chunks ({exc})") from None
        yield from chunks(final=True)


def _ass_text(text: str, *, event_line: bool = False) -> str:
    """Plain text of ASS markup; ``event_line``: a whole ``ReadOrder,Layer,...,Text`` line."""
    if event_line:
        text = text.split(",", 8)[-1]
    text = text.replace("\\N", " ").replace("\\n", " ")
    out, depth = [], 0
    for ch in text:  # drop {\override} blocks
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth = max(0, depth - 1)
        elif not depth:
            out.append(ch)
    return " ".join("".join(out).split())


def _rect_text(rect: Any) -> str:
    """The text of one subtitle rect (ASS or plain text; bitmap subtitles have none)."""
    dialogue = getattr(rect, "dialogue", b"")
    if dialogue:
        return _ass_text(dialogue.decode("utf-8", "replace"))
    text = getattr(rect, "text", b"")
    if text:
        return " ".join(text.decode("utf-8", "replace").split())
    ass = getattr(rect, "ass", b"")
    return _ass_text(ass.decode("utf-8", "replace"), event_line=True) if ass else ""


def subtitle_events(stream_id: str, start_us: int, *, srt: Path | None = None,
                    video: Path | None = None) -> Iterator[TimedRecord]:
    """Captions from a sidecar .srt, else from the container's first text subtitle stream."""
    if srt is not None:
        try:
            text = srt.read_text(encoding="utf-8-sig")
        except OSError as exc:
            raise MediaError(f"{srt}: cannot read subtitles ({exc})") from None
        cues = sorted(parse_srt(text))
        for seq, (a, b, txt) in enumerate(c for c in cues if c[2]):
            yield _rec(TextEvent(stream_id=stream_id, ts=start_us + a, seq=seq, text=txt,
                                 dur=max(0, b - a), trace_id=_trace_id(stream_id, "text", seq)))
        return
    if video is None:
        return
    yield from sorted(_container_subtitles(video, stream_id, start_us))


def _container_subtitles(path: Path, stream_id: str, start_us: int) -> Iterator[TimedRecord]:
    # Subtitle packets are few and may be muxed out of order: they are read whole and sorted.
    with _open(path) as c:
        streams = [s for s in c.streams.subtitles if _is_text_subtitle(s)]
        if not streams:
            return
        stream, origin, seq = streams[0], _origin_us(c), 0
        try:
            for packet in c.demux(stream):
                pts = _pts_us(packet.pts, stream.time_base)
                if pts is None:
                    continue
                dur = _pts_us(packet.duration, stream.time_base) or 0
                # av >= 14 decodes to the rects themselves, older versions to SubtitleSets
                # whose display times are ms relative to the packet
                for item in packet.decode():
                    a, d, rects = pts, dur, [item]
                    if hasattr(item, "start_display_time"):
                        a = pts + int(item.start_display_time) * 1000
                        d = (int(item.end_display_time) - int(item.start_display_time)) * 1000
                        d, rects = (d if d > 0 else dur), list(item)
                    txt = " ".join(x for x in map(_rect_text, rects) if x)
                    if not txt:
                        continue
                    yield _rec(TextEvent(stream_id=stream_id, ts=max(0, start_us + a - origin),
                                         seq=seq, text=txt, dur=max(0, d),
                                         trace_id=_trace_id(stream_id, "text", seq)))
                    seq += 1
        except av.FFmpegError as exc:
            raise MediaError(f"{path}: subtitle decoding failed ({exc})") from None


def video_records(path: Path, stream_id: str, start_us: int, *, fps: float | None = 10.0,
                  chunk_ms: int = 100, max_side: int = 640, srt: Path | None = None,
                  embedded_subs: bool = True, timed: bool = False) -> Iterator[Any]:
    """Every record of a media file, lazily, in ts order.

    Yields (modality, key, value) records, or (ts, record) pairs with
    ``timed=True`` (for real-time pacing). A file without video or without audio
    gives what it has; :func:`probe` first for a clear error on a non-media file.
    """
    if not 1 <= chunk_ms <= 5000:  # 5 s of 48 kHz x 8 channels stays under the 4 MiB limit
        raise MediaError(f"chunk of {chunk_ms} ms: want 1 to 5000")
    gens = [frame_events(path, stream_id, start_us, fps=fps, max_side=max_side),
            audio_events(path, stream_id, start_us, chunk_ms=chunk_ms),
            subtitle_events(stream_id, start_us, srt=srt, video=path if embedded_subs else None)]
    for ts, rec in heapq.merge(*gens, key=lambda r: r[0]):
        yield (ts, rec) if timed else rec
