"""INT8 against FP32 on a fixed set of frames: embedding cosine, NSFW score, decisions.

Both precisions run the CPU models the worker runs (``MMSYNC_PRECISION=fp32`` and
``int8``; built into the models directory the first time). The frames
(``app/features/frames.py``) are never the calibration frames:

* ``other generators``: charts with text, plasma, mosaics, stripes, block noise and
  flat fields (seed 777), none of which calibration uses;
* ``warm fields``: calibration's warm-tone generator with another seed, the only
  synthetic frames Open-NSFW scores above a few percent (up to about 0.7);
* ``test JPEGs``: 640x360 bar charts with and without text and flat colours, as
  ``tests/unit/test_extractors_models.py`` makes them, through the worker's decoder;
* ``photos`` (``--photos DIR``): any JPEG/PNG files there, through the same decoder.

Per group: mean and min cosine of the EfficientNet-Lite0 embeddings, p95 and max of
|P(nsfw) INT8 - FP32|, the largest FP32 score, and how many moderation decisions
(score >= threshold) change at 0.8 (the default) and at 0.5 and 0.3; then the same
figures for FP32 against itself on the frames shifted by one pixel, the model's own
sensitivity to a change nobody would see. Goals (issue 18):
mean cosine >= 0.98, |diff| p95 <= 0.05, no decision changed at 0.8.

    .venv/bin/python scripts/int8_accuracy.py [--n 96] [--photos DIR]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.features.frames import accuracy_frames, warm_frames  # noqa: E402
from app.features.image import ImageExtractor, decode_rgb, effnet_input, nsfw_input  # noqa: E402
from app.features.onnx import ModelRuntime  # noqa: E402
from tests.helpers import chart, jpeg_of  # noqa: E402

_THRESHOLDS = (0.8, 0.5, 0.3)


def test_jpegs() -> list[np.ndarray]:
    """Bar charts (with and without text) and flat colours, 640x360 JPEG, decoded."""
    out = [chart(seed, "HELLO 123" if seed % 2 else "") for seed in range(6)]
    out += [np.full((360, 640, 3), c, np.uint8) for c in ((40, 120, 200), (200, 60, 60))]
    return [decode_rgb(jpeg_of(a), "jpeg") for a in out]


def photos(folder: Path) -> list[np.ndarray]:
    files = sorted(p for p in folder.iterdir() if p.suffix.lower() in (".jpg", ".jpeg", ".png"))
    return [decode_rgb(p.read_bytes(), "png" if p.suffix.lower() == ".png" else "jpeg")
            for p in files]


def outputs(ex: ImageExtractor, rgbs: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Embeddings (not normalised) and P(nsfw), batches of 8, the worker's sessions."""
    assert ex.effnet is not None and ex.nsfw is not None
    embs, probs = [], []
    for i in range(0, len(rgbs), 8):
        chunk = rgbs[i:i + 8]
        embs.append(ex.effnet.run(effnet_input(chunk))[0])
        probs.append(ex.nsfw.run(nsfw_input(chunk))[0][:, 1])
    return np.concatenate(embs).astype(np.float64), np.concatenate(probs).astype(np.float64)


def compare(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]
            ) -> dict[str, float]:
    (ea, pa), (eb, pb) = a, b
    cos = np.sum(ea * eb, 1) / (np.linalg.norm(ea, axis=1) * np.linalg.norm(eb, axis=1) + 1e-12)
    d = np.abs(pa - pb)
    res = {"n": len(cos), "cos_mean": float(cos.mean()), "cos_min": float(cos.min()),
           "d_p95": float(np.percentile(d, 95)), "d_max": float(d.max()),
           "fp32_max": float(pa.max())}
    for t in _THRESHOLDS:
        res[f"flip_{t:g}"] = int(np.sum((pa >= t) != (pb >= t)))
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=96, help="frames from the other generators")
    ap.add_argument("--warm", type=int, default=24, help="warm-field frames")
    ap.add_argument("--photos", type=Path, help="a folder of real photographs to add")
    ap.add_argument("--models-dir", type=Path,
                    default=Path(os.environ.get("MMSYNC_MODELS_DIR", "/tmp/mmsync-models")))
    args = ap.parse_args()
    groups = {"other generators": accuracy_frames(args.n), "warm fields": warm_frames(args.warm),
              "test JPEGs": test_jpegs()}
    if args.photos:
        groups["photos"] = photos(args.photos)
    ex = {}
    for prec in ("fp32", "int8"):
        e = ImageExtractor(ModelRuntime("cpu", models_dir=args.models_dir, precision=prec))
        e.load()
        ex[prec] = e
        print(f"{prec}: {e.version}")
    print(f"\n{'group':<18} {'n':>4} {'cos mean':>9} {'cos min':>8} {'|d| p95':>8} {'|d| max':>8}"
          f" {'fp32 max':>9} " + " ".join(f"{'flips@' + format(t, 'g'):>8}" for t in _THRESHOLDS))
    every = {"fp32": ([], []), "int8": ([], [])}
    for name, rgbs in groups.items():
        outs = {p: outputs(ex[p], rgbs) for p in ex}
        for p in outs:
            every[p][0].append(outs[p][0])
            every[p][1].append(outs[p][1])
        _row(name, compare(outs["fp32"], outs["int8"]))
    allr = compare(*((np.concatenate(every[p][0]), np.concatenate(every[p][1])) for p in ex))
    _row("all", allr)
    print("\nFP32's own sensitivity: FP32 against FP32 on the same frames shifted right by"
          " 1 pixel")
    for name, rgbs in groups.items():
        shifted = [np.roll(r, 1, axis=1) for r in rgbs]
        _row(name, compare(outputs(ex["fp32"], rgbs), outputs(ex["fp32"], shifted)))
    ok = allr["cos_mean"] >= 0.98 and allr["d_p95"] <= 0.05 and allr["flip_0.8"] == 0
    print(f"\ngoals (cos mean >= 0.98, |d| p95 <= 0.05, no decision changed at 0.8): "
          f"{'met' if ok else 'NOT met'}")
    return 0 if ok else 1


def _row(name: str, r: dict[str, float]) -> None:
    print(f"{name:<18} {r['n']:>4} {r['cos_mean']:>9.4f} {r['cos_min']:>8.4f} {r['d_p95']:>8.4f}"
          f" {r['d_max']:>8.4f} {r['fp32_max']:>9.3f} "
          + " ".join(f"{r[f'flip_{t:g}']:>8d}" for t in _THRESHOLDS))


if __name__ == "__main__":
    raise SystemExit(main())
