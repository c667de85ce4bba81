"""Input events of the contract (TextEvent, FrameEvent, AudioChunk) and their validation.

``decode_event`` either returns a valid event or raises ``InvalidInputError``
with a machine-readable reason; it never returns something half-checked.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Literal

from schemas.codec import decode_map, encode
from schemas.errors import InvalidInputError

__all__ = [
    "AudioChunk",
    "Event",
    "FrameEvent",
    "Limits",
    "SCHEMA_VERSION",
    "TextEvent",
    "decode_event",
    "encode_event",
    "sniff_image",
]

SCHEMA_VERSION = 1
_MAX_STREAM_ID = 256


@dataclass(frozen=True, slots=True)
class Limits:
    """Size limits applied while decoding (contract defaults)."""

    max_text_bytes: int = 64 * 1024
    max_image_bytes: int = 8 * 1024 * 1024
    max_audio_bytes: int = 4 * 1024 * 1024
    #: a ts further than this past the wall clock is refused, s; 0 disables.
    max_future_s: int = 7 * 24 * 3600


@dataclass(frozen=True, slots=True)
class _Common:
    stream_id: str
    ts: int
    seq: int | None = None
    trace_id: str | None = None

    def _common(self) -> dict[str, Any]:
        d: dict[str, Any] = {"v": SCHEMA_VERSION, "stream_id": self.stream_id, "ts": self.ts}
        if self.seq is not None:
            d["seq"] = self.seq
        if self.trace_id is not None:
            d["trace_id"] = self.trace_id
        return d


@dataclass(frozen=True, slots=True)
class TextEvent(_Common):
    modality: Literal["text"] = field(default="text", init=False)
    text: str = ""
    dur: int | None = None
    lang: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d = self._common()
        d["text"] = self.text
        if self.dur is not None:
            d["dur"] = self.dur
        if self.lang is not None:
            d["lang"] = self.lang
        return d

    @property
    def duration_us(self) -> int:
        return self.dur or 0


@dataclass(frozen=True, slots=True)
class FrameEvent(_Common):
    modality: Literal["image"] = field(default="image", init=False)
    data: bytes = b""
    fmt: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d = self._common()
        d["data"] = self.data
        if self.fmt is not None:
            d["fmt"] = self.fmt
        return d

    @property
    def duration_us(self) -> int:
        return 0


@dataclass(frozen=True, slots=True)
class AudioChunk(_Common):
    modality: Literal["audio"] = field(default="audio", init=False)
    data: bytes = b""
    sr: int = 16000
    ch: int = 1

    def to_dict(self) -> dict[str, Any]:
        d = self._common()
        d.update(data=self.data, sr=self.sr, ch=self.ch)
        return d

    @property
    def duration_us(self) -> int:
        return len(self.data) * 1_000_000 // (2 * self.ch * self.sr)


Event = TextEvent | FrameEvent | AudioChunk


def encode_event(ev: Event) -> bytes:
    return encode(ev.to_dict())


def sniff_image(data: bytes) -> str | None:
    """``"jpeg"``, ``"png"`` or None, from the magic bytes."""
    if data[:3] == b"\xff\xd8\xff":
        return "jpeg"
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        return "png"
    return None


def _get(d: dict[str, Any], name: str, typ: type | tuple[type, ...], *, required: bool) -> Any:
    if name not in d or d[name] is None:
        if required:
            raise InvalidInputError("schema", f"missing field {name!r}")
        return None
    val = d[name]
    # bool is an int in Python; refuse it where an int is meant.
    if not isinstance(val, typ) or (typ is int and isinstance(val, bool)):
        want = typ.__name__ if isinstance(typ, type) else "/".join(t.__name__ for t in typ)
        raise InvalidInputError("schema", f"field {name!r} must be {want}, got "
                                f"{type(val).__name__}")
    return val


def decode_event(
    modality: str, key: bytes | None, raw: bytes | None, limits: Limits | None = None,
    *, now_us: int | None = None,
) -> Event:
    """Decode and validate one input record of ``modality`` (text, image or audio)."""
    lim = limits or Limits()
    if raw is not None and modality == "image" and len(raw) > lim.max_image_bytes + 4096:
        raise InvalidInputError("too_large", f"record of {len(raw)} bytes exceeds the frame limit")
    d = decode_map(raw)
    v = d.get("v")
    # exactly the int 1: msgpack's 1.0 and True compare equal to 1 in Python
    if type(v) is not int or v != SCHEMA_VERSION:
        raise InvalidInputError("bad_version", f"schema version {v!r} is not supported (want 1)")
    stream_id = _get(d, "stream_id", str, required=True)
    if not 1 <= len(stream_id) <= _MAX_STREAM_ID:
        raise InvalidInputError("schema", f"stream_id must have 1 to 256 characters, has "
                                f"{len(stream_id)}")
    if key is None:
        # Unkeyed records land on any partition, so the modalities of a stream would
        # never meet in one aligner: the contract keys every input by stream_id.
        raise InvalidInputError("key_mismatch", "the record has no key; the key must be "
                                f"the stream_id ({stream_id[:64]!r})")
    try:
        key_str = key.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidInputError("key_mismatch", "message key is not UTF-8") from None
    if key_str != stream_id:
        raise InvalidInputError("key_mismatch", f"key {key_str[:64]!r} != stream_id "
                                f"{stream_id[:64]!r}")
    ts = _get(d, "ts", int, required=True)
    if ts < 0:
        raise InvalidInputError("bad_ts", f"ts {ts} is negative")
    if lim.max_future_s:
        now = now_us if now_us is not None else time.time_ns() // 1000
        if ts > now + lim.max_future_s * 1_000_000:
            raise InvalidInputError("bad_ts", f"ts {ts} lies more than {lim.max_future_s} s in "
                                    "the future")
    seq = _get(d, "seq", int, required=False)
    if seq is not None and seq < 0:
        raise InvalidInputError("schema", "seq must be >= 0")
    trace_id = _get(d, "trace_id", str, required=False)
    if trace_id is not None and len(trace_id) > 128:
        raise InvalidInputError("too_large", "trace_id longer than 128 characters")
    common = {"stream_id": stream_id, "ts": ts, "seq": seq, "trace_id": trace_id}

    if modality == "text":
        text = _get(d, "text", str, required=True)
        if len(text.encode("utf-8", "surrogatepass")) > lim.max_text_bytes:
            raise InvalidInputError("too_large", f"text exceeds {lim.max_text_bytes} bytes")
        dur = _get(d, "dur", int, required=False)
        if dur is not None and dur < 0:
            raise InvalidInputError("schema", "dur must be >= 0")
        lang = _get(d, "lang", str, required=False)
        if lang is not None and len(lang) > 35:  # BCP 47 tags are at most 35 characters
            raise InvalidInputError("schema", "lang longer than 35 characters")
        return TextEvent(**common, text=text, dur=dur, lang=lang)
    if modality == "image":
        data = _get(d, "data", bytes, required=True)
        if len(data) > lim.max_image_bytes:
            raise InvalidInputError("too_large", f"image of {len(data)} bytes exceeds "
                                    f"{lim.max_image_bytes}")
        fmt = _get(d, "fmt", str, required=False)
        if fmt is not None and fmt not in ("jpeg", "png"):
            raise InvalidInputError("schema", f"fmt {fmt[:16]!r} is not jpeg or png")
        sniffed = sniff_image(data)
        if sniffed is None:
            raise InvalidInputError("bad_image", "data is neither JPEG nor PNG")
        if fmt is not None and fmt != sniffed:
            raise InvalidInputError("bad_image", f"fmt says {fmt} but the data is {sniffed}")
        return FrameEvent(**common, data=data, fmt=sniffed)
    if modality == "audio":
        data = _get(d, "data", bytes, required=True)
        if len(data) > lim.max_audio_bytes:
            raise InvalidInputError("too_large", f"audio chunk of {len(data)} bytes exceeds "
                                    f"{lim.max_audio_bytes}")
        sr = _get(d, "sr", int, required=True)
        ch = _get(d, "ch", int, required=False)
        ch = 1 if ch is None else ch
        if not 8000 <= sr <= 48000:
            raise InvalidInputError("bad_audio", f"sr {sr} outside 8000..48000")
        if not 1 <= ch <= 8:
            raise InvalidInputError("bad_audio", f"ch {ch} outside 1..8")
        if not data or len(data) % (2 * ch):
            raise InvalidInputError("bad_audio", f"{len(data)} bytes is not a whole number of "
                                    f"{ch}-channel 16-bit frames")
        return AudioChunk(**common, data=data, sr=sr, ch=ch)
    raise ValueError(f"unknown modality {modality!r}")
