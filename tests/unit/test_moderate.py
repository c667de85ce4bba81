"""Moderation flags and report over decoded windows, and tail's renderings; no broker."""

from __future__ import annotations

import base64
import json

from rich.console import Console

from app.clients.moderate import Report, Thresholds, flag_window
from app.clients.render import render_window, window_json


def _window(sid: str = "s", start: int = 0, *, nsfw: float | None = None,
            terms: tuple[str, ...] = (), audio_off: float = 0.0, text_off: float = 0.0):
    return {
        "v": 1, "id": f"{sid}@{start}", "stream_id": sid, "window_start": start,
        "window_end": start + 1_000_000, "rate_hz": 20.0,
        "offsets_ms": {"image": 0.0, "audio": audio_off, "text": text_off},
        "confidence": {"image": 1.0, "audio": 0.8, "text": 0.3},
        "counts": {"image": 10, "audio": 10, "text": 1},
        "grid": {"image": {"luma": [0.5] * 20, "change": [0.0] * 20,
                           "emb": {"dtype": "float16", "shape": [2], "data": b"\x00\x3c\x00\x3c"}},
                 "audio": {"rms": [0.1] * 20},
                 "text": {"caption": [1.0] * 20, "tokens": [["欢迎"]] + [[]] * 19, "emb": None}},
        "moderation": {"nsfw_max": nsfw, "terms": list(terms)},
        "trace_ids": ["s:image:0"], "emitted_at": 1,
    }


def test_flag_window_thresholds():
    th = Thresholds(nsfw=0.8, terms=True)
    assert flag_window(_window(nsfw=0.1), th) is None
    assert flag_window(_window(), th) is None  # light models: no scores, never flagged
    f = flag_window(_window(start=2_000_000, nsfw=0.93), th)
    assert f is not None and f.window_id == "s@2000000"
    assert f.reasons == ("nsfw 0.93 >= 0.80",)
    assert "FLAG s [2.00s..3.00s]" in f.line()
    f = flag_window(_window(nsfw=0.8, terms=("赌博", "kill")), th)
    assert f is not None and f.reasons == ("nsfw 0.80 >= 0.80", "terms: 赌博, kill")
    # terms flag only when asked; NSFW off with None
    assert flag_window(_window(terms=("kill",)), Thresholds(terms=False)) is None
    assert flag_window(_window(nsfw=0.99), Thresholds(nsfw=None)) is None
    # a window without a moderation map, or with odd values, is not flagged
    w = _window()
    del w["moderation"]
    assert flag_window(w, th) is None
    assert flag_window({**_window(), "moderation": {"nsfw_max": "high", "terms": None}}, th) is None


def test_report_per_stream_and_dedup():
    r = Report(thresholds=Thresholds(nsfw=0.5, terms=True))
    flags = [r.add(w) for w in (
        _window("a", 0, nsfw=0.2, audio_off=10, text_off=-40),
        _window("a", 1_000_000, nsfw=0.7, audio_off=30, text_off=-20),
        _window("a", 1_000_000, nsfw=0.7),  # replayed window id: counted once
        _window("b", 0, terms=("kill",), audio_off=-5),
    )]
    assert [f is not None for f in flags] == [False, True, False, True]
    assert r.windows == 3 and r.flagged == 2
    a, b = r.streams["a"], r.streams["b"]
    assert (a.windows, a.flagged, a.nsfw_max) == (2, 1, 0.7)
    assert a.mean_offset("audio") == 20.0 and a.mean_offset("text") == -30.0
    assert b.terms == {"kill"} and b.nsfw_max is None and b.mean_offset("image") is None
    console = Console(width=200, record=True)
    console.print(r.table())
    out = console.export_text()
    assert "3 windows, 2 flagged" in out
    assert "0.70" in out and "+20" in out and "-30" in out and "kill" in out


def test_tail_renderings():
    w = _window(nsfw=0.42, terms=("kill",), audio_off=12)
    line = render_window(w)
    assert line.startswith("s ") and "img 10" in line and "aud 10" in line and "txt  1" in line
    assert "a  +12" in line and "conf a0.8 t0.3" in line
    assert "nsfw=0.42" in line and "terms=kill" in line and "欢迎" in line
    d = json.loads(window_json(w))
    assert "emb" not in d["grid"]["image"] and "emb" not in d["grid"]["text"]
    assert d["grid"]["text"]["tokens"][0] == ["欢迎"] and d["counts"] == w["counts"]
    full = json.loads(window_json(w, full=True))
    emb = full["grid"]["image"]["emb"]
    assert base64.b64decode(emb["data"]) == b"\x00\x3c\x00\x3c"
    assert "\n" not in window_json(w, full=True)
