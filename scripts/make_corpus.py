"""Make the corpus's real encoded clips once: h264/aac with real synthesized speech.

Needs Debian's espeak-ng (``apt-get install -y espeak-ng``); the clips are
committed under ``tests/data/corpus/``, so tests and benchmarks never run this.

Each clip: 320x180 at 25 fps, 30-40 s; speech from espeak-ng (English, or
Chinese ``cmn``), a card on screen exactly while each word or phrase sounds,
a drifting noisy background (or music with cuts, or a long still and silent
stretch), the sound delayed by a known amount in the file itself, and a
sidecar .srt shifted by a known amount (or ASR-like, each caption late by its
own delay). Beside each: NAME.json, its truth (scripts/benchlib/corpus/truth.py).

    .venv/bin/python scripts/make_corpus.py            # all clips into tests/data/corpus/
    .venv/bin/python scripts/make_corpus.py --only en-talking --out /tmp/c
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import wave
from dataclasses import dataclass, field
from pathlib import Path

import av
import numpy as np
import soxr
from PIL import Image, ImageDraw, ImageFont

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.benchlib.corpus.clips import CLIP_DIR  # noqa: E402
from scripts.benchlib.corpus.render import drum_hit, jingle_note, place, texture  # noqa: E402
from scripts.benchlib.corpus.truth import Caption, Offset, StreamTruth, Stretch  # noqa: E402

W, H, FPS = 320, 180, 25

EN = ("hello", "welcome back", "camera", "the price", "today", "sound check", "picture",
      "thank you", "subscribe", "good morning", "my friends", "market", "special offer",
      "quickly", "number seven", "orange", "window", "river", "look here", "one more")
CMN = ("你好", "欢迎来到直播间", "今天", "这个价格", "谢谢大家", "新产品", "点赞关注",
       "非常优惠", "下次再见", "大家好", "我们开始吧", "马上就到")


@dataclass
class Clip:
    name: str
    seconds: float
    sr: int
    ch: int
    audio_delay_ms: float
    #: subtitles: every cue shifted by text_ms; asr: each caption late by text_ms +- spread.
    captions: str
    text_ms: float
    voice: str = "en"
    words: tuple[str, ...] = EN
    picture: str = "talking"  # talking, panning, music, static
    pan_px_s: float = 6.0
    quiet: tuple[float, float] | None = None
    seed: int = 1
    info: dict[str, str] = field(default_factory=dict)


CLIPS = (
    # the second report: 40 s, cards per word, drifting noisy background, +280 / -150
    Clip("en-talking", 40.0, 48000, 2, 280.0, "subtitles", -150.0, seed=1),
    Clip("cmn-talking", 36.0, 16000, 1, 200.0, "asr", 800.0, voice="cmn", words=CMN, seed=2),
    Clip("en-music", 32.0, 44100, 2, 360.0, "subtitles", 200.0, picture="music", seed=3),
    Clip("en-static", 38.0, 22050, 1, -120.0, "subtitles", -250.0, picture="static",
         quiet=(10.0, 30.0), seed=4),
    Clip("en-panning", 34.0, 32000, 1, 400.0, "subtitles", 200.0, picture="panning",
         pan_px_s=20.0, seed=5),
)


def speak(text: str, voice: str, sr: int, tmp: Path) -> np.ndarray:
    """espeak-ng's speech of ``text`` at ``sr``, trimmed to where it sounds."""
    wav = tmp / "say.wav"
    subprocess.run(["espeak-ng", "-v", voice, "-s", "160", "-w", str(wav), text], check=True)
    with wave.open(str(wav), "rb") as w:
        x = np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.float64) / 32768
        src = w.getframerate()
    x = soxr.resample(x, src, sr)
    hop = sr // 200  # 5 ms
    rms = np.sqrt(np.convolve(x ** 2, np.ones(hop) / hop, mode="same"))
    loud = np.nonzero(rms > 0.03 * rms.max())[0]
    return 0.8 * x[loud[0]:loud[-1] + 1] / np.abs(x).max()


def _schedule(clip: Clip, rng: np.random.Generator, lengths: list[float]
              ) -> list[tuple[float, float, int]]:
    """(start s, end s, word index) on the picture's time line, skipping the quiet stretch."""
    out, t, k = [], 1.0, 0
    while True:
        d = lengths[k % len(lengths)]
        if clip.quiet and clip.quiet[0] - 0.5 < t + d and t < clip.quiet[1]:
            t = clip.quiet[1] + 0.6
            continue
        if t + d > clip.seconds - 1.5:
            return out
        out.append((t, t + d, k % len(lengths)))
        t += d + rng.uniform(0.5, 1.4)
        k += 1


def _music(clip: Clip, rng: np.random.Generator, audio: np.ndarray
           ) -> tuple[list[tuple[float, float, int]], list[float]]:
    """Drum and jingle sections with clean breaks; cuts at each section start and on some beats."""
    sections, cuts, t = [], [], 0.8
    while t < clip.seconds - 2.5:
        beat = 60.0 / rng.uniform(84, 150)
        n = int(rng.integers(8, 16))
        part = np.zeros(int((n * beat + 1.0) * clip.sr))
        for k in range(n):
            place(part, drum_hit(rng, clip.sr, 0.5 if k % 4 == 0 else 0.3), k * beat, clip.sr)
            if k % 2 == 0:
                place(part, jingle_note(clip.sr, float(rng.choice([262, 330, 392, 440, 523])),
                                        beat * 1.5, 0.1), k * beat, clip.sr)
            if k and rng.random() < 0.33:
                cuts.append(t + k * beat)
        end = min(n * beat, clip.seconds - 1.0 - t)
        part[int(end * clip.sr):] = 0.0  # a clean break: nothing rings into it
        place(audio, part, t + clip.audio_delay_ms / 1000, clip.sr)
        sections.append((t, t + end, len(sections)))
        cuts.append(t)
        t += end + rng.uniform(0.5, 1.0)
    return sections, sorted(cuts)


def _card(word: str, rng: np.random.Generator, font: ImageFont.FreeTypeFont
          ) -> tuple[int, int, Image.Image]:
    w, h = int(rng.integers(140, 200)), int(rng.integers(60, 90))
    colour = tuple(int(c) for c in rng.integers(190, 256, 3))
    card = Image.new("RGB", (w, h), colour)
    ImageDraw.Draw(card).text((10, h // 2 - 16), word if word.isascii() else "", fill=(0, 0, 0),
                              font=font)
    return int(rng.integers(10, W - w - 10)), int(rng.integers(10, H - h - 10)), card


def make(clip: Clip, out_dir: Path) -> StreamTruth:
    rng = np.random.default_rng(clip.seed)
    audio = rng.normal(0, 0.002, int(clip.seconds * clip.sr))
    font = ImageFont.load_default(size=28)
    with tempfile.TemporaryDirectory() as tmp:
        if clip.picture == "music":
            spans, cuts = _music(clip, rng, audio)
            words = [f"part {i + 1}" for i in range(len(spans))]
        else:
            sounds = [speak(w, clip.voice, clip.sr, Path(tmp)) for w in clip.words]
            spans, cuts = _schedule(clip, rng, [len(s) / clip.sr for s in sounds]), []
            for a, _, k in spans:
                place(audio, sounds[k], a + clip.audio_delay_ms / 1000, clip.sr)
            words = list(clip.words)
    if clip.quiet:
        audio[int(clip.quiet[0] * clip.sr):int(clip.quiet[1] * clip.sr)] = 0.0
    cards = [] if clip.picture == "music" else [(a, b, *_card(words[k], rng, font))
                                                for a, b, k in spans]
    scenes = [(c, texture(rng, 3 * W, H, cells=int(rng.integers(6, 30)))) for c in cuts]
    bg = texture(rng, 3 * W, H, cells=36)

    def frame(t: float) -> np.ndarray:
        tb = t  # the background's own time: it stands still through the quiet stretch
        if clip.quiet and clip.quiet[0] <= t < clip.quiet[1]:
            tb = clip.quiet[0]  # the same frame, noise and all
        elif clip.quiet and t >= clip.quiet[1]:
            tb = t - (clip.quiet[1] - clip.quiet[0])  # and goes on from where it stopped
        pic = bg
        for c, s in scenes:
            pic = s if c <= t else pic
        x = int(clip.pan_px_s * tb) % (pic.shape[1] - W)
        noise = np.random.default_rng(int(tb * 1000)).normal(0, 4, (H, W, 3))
        img = Image.fromarray(np.clip(pic[:, x:x + W] + noise, 0, 255).astype(np.uint8))
        for a, b, cx, cy, card in cards:
            if a <= t < b:
                img.paste(card, (cx, cy))
        return np.asarray(img)

    video = out_dir / f"{clip.name}.mp4"
    _encode(video, frame, audio, clip)
    truth = _truth(clip, spans, words, rng)
    _write_srt(out_dir / f"{clip.name}.srt", truth, spans, clip, rng)
    truth.save(out_dir / f"{clip.name}.json")
    return truth


def _encode(path: Path, frame: object, audio: np.ndarray, clip: Clip) -> None:
    with av.open(str(path), "w") as out:
        vs = out.add_stream("libx264", rate=FPS, options={"crf": "30", "preset": "slow"})
        vs.width, vs.height, vs.pix_fmt = W, H, "yuv420p"
        aus = out.add_stream("aac", rate=clip.sr, layout="stereo" if clip.ch == 2 else "mono")
        aus.bit_rate = 48_000 if clip.ch == 2 else 32_000
        for i in range(int(clip.seconds * FPS)):
            f = av.VideoFrame.from_ndarray(frame(i / FPS), format="rgb24")  # type: ignore[operator]
            f.pts = i
            for p in vs.encode(f):
                out.mux(p)
        for p in vs.encode():
            out.mux(p)
        x = np.clip(audio, -1, 1).astype(np.float32)
        chans = np.stack([x, 0.8 * x]) if clip.ch == 2 else x[None, :]
        step = aus.codec_context.frame_size or 1024
        for k in range(0, chans.shape[1], step):
            f = av.AudioFrame.from_ndarray(np.ascontiguousarray(chans[:, k:k + step]),
                                           format="fltp", layout=aus.layout.name)
            f.sample_rate, f.pts = clip.sr, k
            for p in aus.encode(f):
                out.mux(p)
        for p in aus.encode():
            out.mux(p)


def _truth(clip: Clip, spans: list[tuple[float, float, int]], words: list[str],
           rng: np.random.Generator) -> StreamTruth:
    spread = 250.0 if clip.captions == "asr" else 0.0
    caps = tuple(Caption(speech_s=round(a, 4), delay_ms=round(clip.text_ms + (
        rng.uniform(-spread, spread) if spread else 0.0), 1), text=words[k]) for a, _, k in spans)
    stretches = ([Stretch(0.0, clip.quiet[0], True), Stretch(*clip.quiet, False),
                  Stretch(clip.quiet[1], clip.seconds, True)] if clip.quiet
                 else [Stretch(0.0, clip.seconds, True)])
    return StreamTruth(
        stream_id=clip.name, start_us=0, seconds=clip.seconds,
        offsets={"audio": Offset(skew_ms=clip.audio_delay_ms),
                 # ASR: the offset that fits the captions best in |error| is their delays' median
                 "text": Offset(skew_ms=float(np.median([c.delay_ms for c in caps])),
                                style=clip.captions, captions=caps)},
        stretches=stretches,
        info={"size": f"{W}x{H}", "fps": FPS, "sr": clip.sr, "ch": clip.ch, "voice": clip.voice,
              "picture": clip.picture, "codec": "h264/aac", "made_by": "scripts/make_corpus.py"})


def _srt_time(s: float) -> str:
    ms = max(0, round(s * 1000))
    return f"{ms // 3_600_000:02d}:{ms // 60_000 % 60:02d}:{ms // 1000 % 60:02d},{ms % 1000:03d}"


def _write_srt(path: Path, truth: StreamTruth, spans: list[tuple[float, float, int]], clip: Clip,
               rng: np.random.Generator) -> None:
    cues = []
    caps = truth.offsets["text"].captions
    for i, (cap, (a, b, _)) in enumerate(zip(caps, spans, strict=True)):
        start = cap.speech_s + cap.delay_ms / 1000
        if clip.captions == "asr":
            dur = b - a + 0.2
        else:  # reading time, not the speech's length, and never over the next cue
            nxt = caps[i + 1].speech_s + caps[i + 1].delay_ms / 1000 if i + 1 < len(caps) else 1e9
            dur = max(0.5, min(float(rng.uniform(1.2, 2.5)), nxt - start - 0.05))
        cues.append(f"{i + 1}\n{_srt_time(start)} --> {_srt_time(start + dur)}\n{cap.text}\n")
    path.write_text("\n".join(cues), encoding="utf-8")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=CLIP_DIR)
    ap.add_argument("--only", action="append", help="only this clip (repeatable)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for clip in CLIPS:
        if args.only and clip.name not in args.only:
            continue
        truth = make(clip, args.out)
        size = (args.out / f"{clip.name}.mp4").stat().st_size
        print(f"{clip.name}: {size / 1024:.0f} KiB, audio {truth.offsets['audio'].skew_ms:+.0f} ms,"
              f" text {clip.captions} {clip.text_ms:+.0f} ms, "
              f"{len(truth.offsets['text'].captions)} captions")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
