"""mmsync moderate's alert logic: alerts confirmed or cleared by the windows that come."""

from __future__ import annotations

from rich.console import Console

from app.clients.alertjoin import AlertJoin
from app.clients.render import alert_json, render_alert
from schemas.alert import Alert, Source


def _alert(kind: str = "term", offset: int = 7, window: str = "s@2000000", *,
           modality: str = "text", sid: str = "s", **detail) -> Alert:
    if not detail:
        detail = {"terms": ["scam"]} if kind in ("term", "ocr_term") else {"threshold": 0.8}
    return Alert(stream_id=sid, modality=modality, kind=kind,
                 score=0.9 if kind == "nsfw" else 1.0, ts=2_100_000, window_id=window,
                 trace_id=f"tr{offset}", source=Source(f"mm.{modality}", 1, offset),
                 emitted_at=1, detail=detail, offset_ms=-40.0, skew_confidence=0.5)


def _window(start: int = 2_000_000, sources=(("text", 1, 7),), *, nsfw=None, terms=("scam",),
            sid: str = "s") -> dict:
    return {"id": f"{sid}@{start}", "stream_id": sid, "window_start": start,
            "window_end": start + 1_000_000, "sources": [list(x) for x in sources],
            "moderation": {"nsfw_max": nsfw, "terms": list(terms)}}


def test_alert_then_its_window_with_the_signal_confirms():
    j = AlertJoin()
    (n,) = j.on_alert(_alert())
    assert n.verb == "ALERT" and "term" in n.line() and "terms: scam" in n.line()
    assert "skew -40 ms conf 0.50" in n.line() and "s@2000000" in n.line()
    assert j.on_window(_window(1_000_000, [("text", 1, 3)])) == []  # an earlier window
    (n,) = j.on_window(_window())
    assert n.verb == "CONFIRMED" and "tr7" in n.line()
    st = j.streams["s"]
    assert (st.alerts, st.confirmed, st.cleared, st.open) == (1, 1, 0, 0)


def test_window_without_the_signal_or_without_the_input_clears():
    j = AlertJoin()
    j.on_alert(_alert(offset=1))
    j.on_alert(_alert("nsfw", offset=2, modality="image"))
    j.on_alert(_alert(offset=3))
    notes = j.on_window(_window(sources=[("text", 1, 1), ("image", 1, 2)], terms=(), nsfw=0.5))
    assert sorted(n.verb for n in notes) == ["CLEARED", "CLEARED", "CLEARED"]
    text = "\n".join(n.line() for n in notes)
    assert "holds the input but not the signal" in text  # offsets 1 (terms) and 2 (nsfw 0.5)
    assert "closed without the input" in text  # offset 3: late, or moved
    assert j.streams["s"].cleared == 3 and j.streams["s"].open == 0


def test_nsfw_confirms_on_the_windows_maximum():
    j = AlertJoin()
    j.on_alert(_alert("nsfw", offset=2, modality="image"))
    (n,) = j.on_window(_window(sources=[("image", 1, 2)], nsfw=0.93))
    assert n.verb == "CONFIRMED"


def test_input_in_another_window_clears_and_ocr_terms_confirm_by_the_input():
    j = AlertJoin()
    j.on_alert(_alert(offset=4))
    j.on_alert(_alert("ocr_term", offset=5, modality="image"))
    notes = j.on_window(_window(3_000_000, [("text", 1, 4)]))
    assert [n.verb for n in notes] == ["CLEARED"] and "landed in s@3000000" in notes[0].line()
    (n,) = j.on_window(_window(sources=[("image", 1, 5)], terms=()))  # no OCR in windows
    assert n.verb == "CONFIRMED"


def test_alert_read_after_its_window_is_decided_at_once():
    j = AlertJoin()
    j.on_window(_window(sources=[("text", 1, 7), ("text", 1, 8)]))
    verbs = [n.verb for n in j.on_alert(_alert(offset=7))]
    assert verbs == ["ALERT", "CONFIRMED"]
    assert [n.verb for n in j.on_alert(_alert(offset=9))] == ["ALERT", "CLEARED"]
    j.on_window(_window(5_000_000, [("text", 1, 10)]))
    notes = j.on_alert(_alert(offset=10))  # predicted 2 s, it is in 5 s
    assert "landed in s@5000000" in notes[-1].line()
    # a replayed alert (same kind and source) counts once; a window replayed is harmless
    assert j.on_alert(_alert(offset=7)) == []
    assert j.on_window(_window(sources=[("text", 1, 7)])) == []
    st = j.streams["s"]
    assert (st.alerts, st.duplicates, st.confirmed, st.cleared) == (3, 1, 1, 2)


def test_blind_periods_and_the_report():
    j = AlertJoin()
    b = Alert(stream_id="cam", modality="image", kind="blind", score=0.5, ts=1_200_000,
              window_id="cam@1000000", trace_id="x", source=Source("mm.image", 0, 3),
              emitted_at=1, detail={"skipped": 3, "frames": 6, "level": 2, "reason": "sampled",
                                    "ts_from": 1_200_000, "ts_to": 2_400_000})
    (n,) = j.on_alert(b)
    assert n.verb == "BLIND" and "3/6 frames unscored 1.20s..2.40s" in n.line()
    assert "level 2" in n.line()
    j.on_alert(Alert(**{**_blind_kw(b), "detail": {**b.detail, "ts_from": 5_000_000,
                                                   "ts_to": 5_400_000, "skipped": 2}}))
    j.on_alert(_alert(sid="cam"))
    st = j.streams["cam"]
    assert (st.blind_batches, st.blind_frames, st.blind_span, st.open) == (
        2, 5, (1_200_000, 5_400_000), 1)
    console = Console(width=200, record=True)
    console.print(j.table())
    out = console.export_text()
    assert "alerts: 1, confirmed 0, cleared 0, open 1" in out
    assert "1.20s..5.40s (2 batches)" in out and "term 1" in out


def _blind_kw(a: Alert) -> dict:
    return {f: getattr(a, f) for f in a.__dataclass_fields__}


def test_tail_renders_alerts():
    line = render_alert(_alert().to_dict())
    assert line.startswith("ALERT s") and "text term terms=scam -> s@2000000" in line
    assert "skew -40ms c0.5" in line
    blind = _alert("blind", modality="image", skipped=2, frames=8, level=3,
                   reason="off").to_dict()
    assert "2/8 frames unscored (level 3, off)" in render_alert(blind)
    assert "score=0.900" in render_alert(_alert("nsfw", modality="image").to_dict())
    assert '"window_id":"s@2000000"' in alert_json(_alert().to_dict())
