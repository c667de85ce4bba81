"""The Alert (mm.alerts) and SkewState (PREFIX.skew) records: round trips and bad input."""

from __future__ import annotations

import msgpack
import pytest

from schemas.alert import ALERT_VERSION, KINDS, Alert, Source
from schemas.aligned import AlignedWindow
from schemas.errors import InvalidInputError
from schemas.skew import SkewState


def _alert(**kw) -> Alert:
    base = dict(stream_id="cam-1", modality="text", kind="term", score=1.0, ts=2_345_000,
                window_id="cam-1@2000000", trace_id="t-1", source=Source("mm.text", 3, 17),
                emitted_at=1_700_000_000_000_000, detail={"terms": ["诈骗", "scam"]},
                event_ts=2_465_000, offset_ms=120.0, skew_confidence=0.8,
                kafka_ts_ms=1_700_000_000_000)
    base.update(kw)
    return Alert(**base)


def _raw(**fields) -> bytes:
    d = _alert().to_dict()
    d.update(fields)
    return msgpack.packb({k: v for k, v in d.items() if v is not ...}, use_bin_type=True)


def test_alert_round_trip_keeps_every_field():
    a = _alert()
    d = msgpack.unpackb(a.encode(), raw=False)
    assert d["v"] == ALERT_VERSION
    assert d["source"] == {"topic": "mm.text", "partition": 3, "offset": 17}
    # the contract's fields, all there
    assert {"v", "stream_id", "modality", "kind", "score", "detail", "ts", "window_id",
            "trace_id", "source", "emitted_at"} <= set(d)
    assert Alert.decode(a.encode()) == a
    blind = _alert(modality="image", kind="blind", score=0.5,
                   detail={"skipped": 4, "frames": 8, "offsets": [[0, 1], [0, 3]]})
    assert Alert.decode(blind.encode()) == blind


def test_alert_decodes_without_the_mmsync_extras_and_with_unknown_kinds():
    d = _alert().to_dict()
    for k in ("event_ts", "offset_ms", "skew_confidence", "kafka_ts_ms", "detail"):
        del d[k]
    d["kind"] = "violence"  # a newer producer's kind: decodes, the consumer decides
    d["extra"] = "ignored"
    a = Alert.decode(msgpack.packb(d))
    assert a.kind == "violence" and a.detail == {} and a.skew_confidence == 0.0


@pytest.mark.parametrize(("fields", "reason"), [
    ({"v": 2}, "bad_version"),
    ({"score": 1.5}, "schema"),
    ({"score": "high"}, "schema"),
    ({"score": float("nan")}, "schema"),
    ({"ts": -1}, "schema"),
    ({"ts": True}, "schema"),
    ({"stream_id": ""}, "schema"),
    ({"kind": None}, "schema"),
    ({"source": ["mm.text", 3, 17]}, "schema"),
    ({"source": {"topic": "mm.text", "partition": -1, "offset": 0}}, "schema"),
    ({"detail": ["kill"]}, "schema"),
    ({"skew_confidence": 2.0}, "schema"),
    ({"window_id": ...}, "schema"),
])
def test_alert_bad_input_is_refused_with_a_reason(fields, reason):
    with pytest.raises(InvalidInputError) as err:
        Alert.decode(_raw(**fields))
    assert err.value.reason == reason


def test_alert_not_a_map():
    for raw in (None, b"\xc1", msgpack.packb([1, 2])):
        with pytest.raises(InvalidInputError):
            Alert.decode(raw)
    with pytest.raises(ValueError):
        _alert(score=-0.1)


def test_kinds_name_their_modality():
    assert set(KINDS) == {"nsfw", "term", "ocr_term", "blind"}
    assert set(KINDS.values()) <= {"image", "audio", "text"}


def _window() -> AlignedWindow:
    return AlignedWindow(stream_id="s", window_start=3_000_000, window_end=4_000_000,
                         rate_hz=20.0, offsets_ms={"image": 0.0, "audio": 40.0, "text": -250.0},
                         confidence={"image": 1.0, "audio": 0.9, "text": 0.4}, counts={},
                         grid={}, moderation={}, trace_ids=[], emitted_at=123)


def test_skew_state_of_a_window_round_trips():
    st = SkewState.of_window(_window())
    assert st.window_us == 1_000_000 and st.at == 123 and st.offsets_ms["text"] == -250.0
    assert SkewState.decode(st.encode()) == st


@pytest.mark.parametrize("fields", [
    {"v": 9}, {"stream_id": 5}, {"window_us": 0}, {"at": -1}, {"offsets_ms": {"a": "x"}},
    {"confidence": {"audio": 1.5}}, {"confidence": None},
])
def test_skew_state_bad_input(fields):
    d = SkewState.of_window(_window()).to_dict()
    d.update(fields)
    with pytest.raises(InvalidInputError):
        SkewState.decode(msgpack.packb(d))
