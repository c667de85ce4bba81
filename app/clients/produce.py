"""Publishing media to the input topics: synthetic streams, images, WAV, text, subtitles."""

from __future__ import annotations

import asyncio
import re
import time
import wave
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiokafka.structs import RecordMetadata
from rich.progress import Progress

from app.kafka.clients import make_producer
from app.settings import Settings
from schemas.events import AudioChunk, FrameEvent, TextEvent, encode_event, sniff_image

__all__ = ["OnSent", "Published", "Record", "image_records", "paced", "parse_srt", "publish",
           "srt_records", "text_records", "wav_records"]

Record = tuple[str, bytes | None, bytes]


@dataclass
class Published:
    by_modality: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.by_modality.values())


async def _aiter(records: Iterable[Record] | AsyncIterable[Record]) -> AsyncIterator[Record]:
    if isinstance(records, AsyncIterable):
        async for r in records:
            yield r
    else:
        for r in records:
            yield r


async def paced(records: Iterable[tuple[int, Record]], speed: float = 1.0, *,
                stop: asyncio.Event | None = None) -> AsyncIterator[Record]:
    """(ts, record) pairs released at their media time (``ts`` in us, ``speed`` x real
    time) counted from the first; ends early once ``stop`` is set."""
    t0: float | None = None
    ts0 = 0
    for ts, rec in records:
        if stop is not None and stop.is_set():
            return
        if t0 is None:
            t0, ts0 = time.monotonic(), ts
        delay = t0 + (ts - ts0) / 1e6 / speed - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        yield rec


#: Called once per record after the broker acknowledged it: (record, its metadata:
#: topic, partition, offset, timestamp).
OnSent = Callable[[Record, RecordMetadata], None]


async def publish(s: Settings, records: Iterable[Record] | AsyncIterable[Record], *,
                  progress: bool = True, total: int | None = None,
                  on_sent: OnSent | None = None, **producer_kw: Any) -> Published:
    """Send (modality, key, value) records to ``prefix.modality``; acks=all, then flush.

    ``records`` may be lazy (a generator, or an async iterable such as :func:`paced`);
    ``producer_kw`` override the producer's settings (``linger_ms``, say).
    """
    counts: dict[str, int] = {}
    producer = make_producer(s, **producer_kw)
    await producer.start()
    try:
        with Progress(disable=not progress, transient=True) as bar:
            task = bar.add_task("publishing", total=total)
            sent: list[tuple[Record, asyncio.Future[RecordMetadata]]] = []

            async def settle() -> None:
                for rec, fut in sent:
                    md = await fut
                    if on_sent is not None:
                        on_sent(rec, md)
                sent.clear()

            async for rec in _aiter(records):
                modality, key, value = rec
                sent.append((rec, await producer.send(s.topic(modality), value=value, key=key)))
                counts[modality] = counts.get(modality, 0) + 1
                bar.advance(task)
                if len(sent) >= 512:
                    await settle()
            await producer.flush()
            await settle()
    finally:
        await producer.stop()
    return Published(counts)


def image_records(paths: Iterable[Path], stream_id: str, start_us: int, fps: float
                  ) -> Iterator[Record]:
    for i, p in enumerate(paths):
        data = p.read_bytes()
        ev = FrameEvent(stream_id=stream_id, ts=start_us + int(i * 1e6 / fps), seq=i, data=data,
                        fmt=sniff_image(data))
        yield "image", stream_id.encode(), encode_event(ev)


def wav_records(path: Path, stream_id: str, start_us: int, chunk_ms: int = 100
                ) -> Iterator[Record]:
    """A 16-bit PCM WAV file as AudioChunks of ``chunk_ms``."""
    with wave.open(str(path), "rb") as w:
        if w.getsampwidth() != 2:
            raise ValueError(f"{path}: only 16-bit PCM WAV is supported")
        sr, ch = w.getframerate(), w.getnchannels()
        frames = max(1, sr * chunk_ms // 1000)
        i = 0
        while True:
            data = w.readframes(frames)
            if not data:
                break
            ev = AudioChunk(stream_id=stream_id, ts=start_us + i * frames * 1_000_000 // sr,
                            seq=i, data=data, sr=sr, ch=ch)
            yield "audio", stream_id.encode(), encode_event(ev)
            i += 1


def text_records(lines: Iterable[str], stream_id: str, start_us: int, every_ms: int = 1000
                 ) -> Iterator[Record]:
    for i, line in enumerate(x for x in lines if x.strip()):
        ev = TextEvent(stream_id=stream_id, ts=start_us + i * every_ms * 1000, seq=i,
                       text=line.strip(), dur=every_ms * 1000)
        yield "text", stream_id.encode(), encode_event(ev)


_SRT_TIME = re.compile(r"(\d+):(\d+):(\d+)[,.](\d+)\s*-->\s*(\d+):(\d+):(\d+)[,.](\d+)")


def parse_srt(text: str) -> list[tuple[int, int, str]]:
    """(start_us, end_us, text) cues of an .srt file."""
    cues = []
    for block in re.split(r"\r?\n\s*\r?\n", text.strip()):
        lines = block.strip().splitlines()
        for j, line in enumerate(lines):
            m = _SRT_TIME.search(line)
            if m:
                g = [int(x) for x in m.groups()]
                a = ((g[0] * 60 + g[1]) * 60 + g[2]) * 1_000_000 + g[3] * 1000
                b = ((g[4] * 60 + g[5]) * 60 + g[6]) * 1_000_000 + g[7] * 1000
                cues.append((a, b, " ".join(lines[j + 1:]).strip()))
                break
    return cues


def srt_records(path: Path, stream_id: str, start_us: int) -> Iterator[Record]:
    for i, (a, b, txt) in enumerate(parse_srt(path.read_text(encoding="utf-8-sig"))):
        if txt:
            ev = TextEvent(stream_id=stream_id, ts=start_us + a, seq=i, text=txt, dur=b - a)
            yield "text", stream_id.encode(), encode_event(ev)
