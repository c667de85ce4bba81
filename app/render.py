"""Readable one-line renderings of aligned windows (for tail and demo)."""

from __future__ import annotations

from typing import Any

__all__ = ["render_window", "spark"]

_BARS = " ▁▂▃▄▅▆▇█"


def spark(values: list[Any], top: float | None = None) -> str:
    """A sparkline of a grid row; '·' where a tick has no data."""
    nums = [v for v in values if isinstance(v, int | float)]
    hi = top if top is not None else (max(nums) if nums else 1.0)
    hi = hi or 1.0
    out = []
    for v in values:
        if not isinstance(v, int | float):
            out.append("·")
        else:
            out.append(_BARS[min(len(_BARS) - 1, int(round(v / hi * (len(_BARS) - 1))))])
    return "".join(out)


def render_window(w: dict[str, Any]) -> str:
    g = w.get("grid", {})
    counts = w.get("counts", {})
    offs = w.get("offsets_ms", {})
    t0 = w["window_start"] / 1e6
    tokens = [t for tick in g.get("text", {}).get("tokens", []) for t in tick]
    mod = w.get("moderation", {})
    parts = [
        f"{w['stream_id']:<10} [{t0:12.2f}s +{(w['window_end'] - w['window_start']) / 1e6:.1f}s]",
        f"img {counts.get('image', 0):2d} |{spark(g.get('image', {}).get('change', []), 0.3)}|",
        f"aud {counts.get('audio', 0):2d} |{spark(g.get('audio', {}).get('rms', []), 0.25)}|",
        f"txt {counts.get('text', 0):2d} |{spark(g.get('text', {}).get('caption', []), 1.0)}|",
        f"off a{offs.get('audio', 0):+5.0f} t{offs.get('text', 0):+5.0f} ms",
    ]
    if tokens:
        parts.append("“" + " ".join(tokens)[:40] + "”")
    if mod.get("terms"):
        parts.append(f"terms={','.join(mod['terms'])}")
    return "  ".join(parts)
