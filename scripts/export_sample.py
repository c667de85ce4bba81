"""Write the built-in synthetic stream as files (JPEG frames, a WAV, an .srt) to try
``mmsync produce --image ... --wav ... --srt ...`` with.

    .venv/bin/python scripts/export_sample.py OUT_DIR [--seconds 5]
"""

from __future__ import annotations

import argparse
import wave
from pathlib import Path

from app.clients.synth import SynthSpec, synth_events
from schemas.events import AudioChunk, FrameEvent, TextEvent


def _srt_time(us: int) -> str:
    ms = us // 1000
    return f"{ms // 3_600_000:02d}:{ms // 60_000 % 60:02d}:{ms // 1000 % 60:02d},{ms % 1000:03d}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--seconds", type=float, default=5.0)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    spec = SynthSpec(seconds=args.seconds, start_us=0)
    events, _ = synth_events(spec)
    pcm = bytearray()
    cues = []
    for ev in events:
        if isinstance(ev, FrameEvent):
            (args.out / f"frame{ev.seq:05d}.jpg").write_bytes(ev.data)
        elif isinstance(ev, AudioChunk):
            pcm += ev.data
        elif isinstance(ev, TextEvent):
            cues.append((ev.ts, ev.ts + (ev.dur or 0), ev.text))
    with wave.open(str(args.out / "audio.wav"), "wb") as w:
        w.setnchannels(spec.ch)
        w.setsampwidth(2)
        w.setframerate(spec.sr)
        w.writeframes(bytes(pcm))
    srt = "\n".join(f"{i + 1}\n{_srt_time(a)} --> {_srt_time(b)}\n{t}\n"
                    for i, (a, b, t) in enumerate(cues))
    (args.out / "captions.srt").write_text(srt, encoding="utf-8")
    print(f"wrote frames, audio.wav and captions.srt to {args.out}")


if __name__ == "__main__":
    main()
