"""Readable one-line renderings of aligned windows (for tail and demo)."""

from __future__ import annotations

import base64
import json
from typing import Any

__all__ = ["alert_json", "render_alert", "render_window", "spark", "window_json"]

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
        f"off a{offs.get('audio', 0):+5.0f} t{offs.get('text', 0):+5.0f} ms"
        + _conf(w.get("confidence", {})),
    ]
    if tokens:
        parts.append("“" + " ".join(tokens)[:40] + "”")
    if isinstance(mod.get("nsfw_max"), int | float):
        parts.append(f"nsfw={mod['nsfw_max']:.2f}")
    if mod.get("terms"):
        parts.append(f"terms={','.join(mod['terms'])}")
    return "  ".join(parts)


def _conf(conf: dict[str, Any]) -> str:
    """Skew confidence of audio and text, when the window carries it."""
    vals = [f"{m[0]}{conf[m]:.1f}" for m in ("audio", "text")
            if isinstance(conf.get(m), int | float)]
    return f" (conf {' '.join(vals)})" if vals else ""


def _jsonable(v: Any) -> Any:
    if isinstance(v, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(v)).decode("ascii")
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_jsonable(x) for x in v]
    return v


def window_json(w: dict[str, Any], *, full: bool = False) -> str:
    """One window as one JSON line: bytes as base64; the grid's embeddings only with ``full``."""
    if not full and isinstance(w.get("grid"), dict):
        grid = {m: ({k: v for k, v in row.items() if k != "emb"} if isinstance(row, dict)
                    else row) for m, row in w["grid"].items()}
        w = {**w, "grid": grid}
    return json.dumps(_jsonable(w), ensure_ascii=False, separators=(",", ":"))


def render_alert(a: dict[str, Any]) -> str:
    """One alert (a decoded ``mm.alerts`` map) as one line."""
    raw = a.get("detail")
    d: dict[str, Any] = raw if isinstance(raw, dict) else {}
    kind, ts = a.get("kind"), a.get("ts")
    when = f"{ts / 1e6:12.2f}s" if isinstance(ts, int | float) else "?"
    if kind == "blind":
        what = (f"{d.get('skipped', '?')}/{d.get('frames', '?')} frames unscored "
                f"(level {d.get('level', '?')}, {d.get('reason', '?')})")
    elif d.get("terms"):
        what = "terms=" + ",".join(str(t) for t in d["terms"])
    else:
        score = a.get("score")
        what = f"score={score:.3f}" if isinstance(score, int | float) else "score=?"
    conf = a.get("skew_confidence")
    skew = (f"skew {a.get('offset_ms', 0):+.0f}ms c{conf:.1f}"
            if isinstance(conf, int | float) and a.get("modality") != "image" else "")
    return (f"ALERT {a.get('stream_id', '?')!s:<10} [{when}] {a.get('modality', '?')}"
            f" {kind} {what} -> {a.get('window_id', '?')} {skew}").rstrip()


def alert_json(a: dict[str, Any]) -> str:
    """One alert as one JSON line (bytes as base64)."""
    return json.dumps(_jsonable(a), ensure_ascii=False, separators=(",", ":"))
