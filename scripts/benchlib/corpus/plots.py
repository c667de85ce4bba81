"""One small PNG per kind: estimate and truth over media time per modality, confidence shaded.

A person judges sync by looking: the black line is the true lag, the blue
steps are what the aligner said at each window's emission, the green shading
below is its confidence (0..1, right axis), grey spans are non-informative
stretches and the dotted line is the oracle. matplotlib is a dev dependency.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display

import matplotlib.pyplot as plt  # noqa: E402

from scripts.benchlib.corpus.run import CaseResult  # noqa: E402

__all__ = ["plot_kinds"]

#: Streams drawn per kind (rows), to keep each picture small.
_ROWS = 4


def plot_kinds(results: Sequence[CaseResult], out_dir: Path, which: str) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for kind in sorted({r.case.kind for r in results}):
        every = [(r, s) for r in results if r.case.kind == kind
                 for s in r.scored if s.modality == "audio"]
        # spread over the kind's cases (both sets when both ran), not just its first ones
        pick = sorted({round(i * (len(every) - 1) / max(1, _ROWS - 1)) for i in range(_ROWS)})
        rows = [every[i] for i in pick if i < len(every)]
        path = out_dir / f"corpus-{kind}.png"
        _plot(rows, results, kind, which, path)
        paths.append(path)
    return paths


def _captions(ax: plt.Axes, r: CaseResult, sid: str) -> None:
    """Each caption at its speech's true start: its own delay (ts less that start: where
    its ts puts it, black dot) and the delay its aligned_ts implies (ts less aligned_ts,
    red cross; on the dot where the caption sits on its speech)."""
    tr = r.replay.truths[sid]
    caps = tr.offsets["text"].captions
    pts = [(caps[seq].speech_s, (ts - tr.start_us) / 1e3 - caps[seq].speech_s * 1e3,
            (ts - al) / 1e3) for w in r.replay.windows if w.stream_id == sid
           for seq, ts, al, _c, _t in w.captions if seq is not None and 0 <= seq < len(caps)]
    if not pts:
        return
    x, own, placed = zip(*pts, strict=True)
    ax.scatter(x, own, s=9, color="black", zorder=3, label="caption at ts")
    ax.scatter(x, placed, s=14, marker="x", color="tab:red", zorder=4,
               label="at aligned_ts")


def _plot(rows: list, results: Sequence[CaseResult], kind: str, which: str, path: Path) -> None:
    fig, axes = plt.subplots(len(rows), 2, figsize=(9, 1.9 * len(rows) + 0.6), squeeze=False,
                             sharex="row")
    for i, (r, audio) in enumerate(rows):
        text = next((s for s in r.scored if s.stream_id == audio.stream_id
                     and s.modality == "text"), None)
        for j, sc in enumerate((audio, text)):
            ax = axes[i][j]
            if sc is None:
                ax.set_axis_off()
                ax.text(0.5, 0.5, "no captions", ha="center", va="center",
                        transform=ax.transAxes, color="grey")
                continue
            tr = r.replay.truths[sc.stream_id]
            t = [w.t_s for w in sc.wins]
            for q in tr.quiet():
                ax.axvspan(q.t0_s, q.t1_s, color="0.85", lw=0)
            ax.plot(t, [w.true_ms for w in sc.wins], color="black", lw=1.2, label="truth")
            ax.step(t, [w.est_ms for w in sc.wins], where="mid", color="tab:blue", lw=1.2,
                    label="estimate")
            if sc.modality == "text":
                _captions(ax, r, sc.stream_id)
            lag = r.oracle.get(sc.stream_id, {}).get(sc.modality)
            if lag is not None:
                ax.axhline(lag, color="tab:purple", ls=":", lw=1, label="oracle")
            conf = ax.twinx()
            conf.fill_between(t, [w.conf for w in sc.wins], step="mid", color="tab:green",
                              alpha=0.25, lw=0)
            conf.set_ylim(0, 1)
            conf.set_yticks([0, 0.5, 1])
            conf.tick_params(labelsize=6)
            ax.set_zorder(conf.get_zorder() + 1)
            ax.patch.set_visible(False)
            ax.tick_params(labelsize=7)
            ax.set_title(f"{r.case.name} ({r.case.set}) {sc.label}", fontsize=8)
            if j == 0:
                ax.set_ylabel("lag ms", fontsize=7)
            if i == len(rows) - 1:
                ax.set_xlabel("media s", fontsize=7)
            if i == 0:
                ax.legend(fontsize=6, loc="upper right", ncol=3)
    fig.suptitle(f"corpus kind {kind}, set {which}: estimate (blue) vs truth (black), "
                 f"confidence shaded green", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=72)
    plt.close(fig)
