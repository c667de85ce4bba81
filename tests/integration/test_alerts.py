"""Moderation alerts on the real broker with real workers (issue 17).

A caption holding a term from an extra terms file alerts with the right window id,
source and trace id; a clean caption and a bad record do not (the bad one goes to the
dead-letter topic as before); the aligner's skew estimate reaches the feature agents
(alerts carry it once it settles); a degraded batch says which frames went unscored.
"""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path
from typing import Any

import pytest

from app.clients.alertjoin import AlertJoin
from app.clients.collect import collect
from app.clients.moderate import Report, moderate
from app.clients.produce import paced, publish
from app.clients.synth import SynthSpec, synth_events
from app.kafka.clients import consume
from app.kafka.topics import ensure_topics
from schemas.alert import Alert
from schemas.events import FrameEvent, TextEvent, encode_event
from tests.helpers import chart, jpeg_of
from tests.integration.brokers import ON_BOTH

pytestmark = pytest.mark.integration

TIMEOUT = 120


def _terms_file(tmp: Path, *terms: str) -> str:
    p = tmp / "extra_terms.txt"
    p.write_text("# extra terms for this test\n" + "\n".join(terms) + "\n", encoding="utf-8")
    return str(p)


async def _alerts(s: Any, until: Any, timeout_s: float = TIMEOUT) -> list[Alert]:
    out: list[Alert] = []
    await consume(s, [s.topic("alerts")], lambda m: out.append(Alert.decode(m.value)),
                  until=lambda: until(out), timeout_s=timeout_s)
    return out


async def _wait_ready(pipeline: Any, worker: Any, stage: str) -> None:
    """The worker's models are loaded once its load stage has a sample."""
    deadline = time.monotonic() + 120
    while f'mmsync_stage_seconds_count{{stage="{stage}"}} 1.0' not in pipeline.metrics(worker):
        assert time.monotonic() < deadline, pipeline.logs()
        await asyncio.sleep(0.5)


@ON_BOTH
async def test_a_term_from_an_extra_file_alerts_a_clean_caption_and_a_bad_record_do_not(
        pipeline, tmp_path):
    s = pipeline.settings
    await ensure_topics(s)
    worker = pipeline.start_worker(MMSYNC_AGENTS="text,aligner", MMSYNC_TEXT_EMBEDDING="false",
                                   MMSYNC_TERMS_FILES=_terms_file(tmp_path, "zorblax"))
    await _wait_ready(pipeline, worker, "load_text")
    base = 40_000_000
    caps = [TextEvent(stream_id="mod", ts=base + i * 400_000, seq=i, text=t, dur=300_000,
                      trace_id=f"cap-{i}")
            for i, t in enumerate(["hello and welcome", "buy ZORBLAX today", "nothing to see",
                                   "小心电话诈骗", "the weather is fine"])]
    recs = [("text", b"mod", encode_event(e)) for e in caps]
    recs.insert(2, ("text", b"mod", b"\x81\xa1v"))  # a truncated map: bad_msgpack
    where: dict[bytes, tuple[int, int]] = {}
    pub = await publish(s, recs, progress=False,
                        on_sent=lambda r, md: where.__setitem__(r[2], (md.partition, md.offset)))
    alerts = await _alerts(s, lambda a: len(a) >= 2)
    out = await collect(s, until=lambda o: o.accounted >= pub.total, timeout_s=TIMEOUT)
    assert out.accounted == pub.total, pipeline.logs()
    assert [d["error"] for d in out.dlq] == ["bad_msgpack"]
    await asyncio.sleep(1.0)  # anything else would have come by now
    alerts = await _alerts(s, lambda a: False, timeout_s=2)
    assert sorted(a.trace_id for a in alerts) == ["cap-1", "cap-3"], alerts
    placed = {(m, p, o): w["id"] for w in out.windows for m, p, o in w["sources"]}
    for a in alerts:
        ev = caps[int(a.trace_id.split("-")[1])]
        assert (a.kind, a.modality, a.stream_id, a.score) == ("term", "text", "mod", 1.0)
        assert a.detail["terms"] == (["zorblax"] if ev.seq == 1 else ["诈骗"])
        assert (a.source.partition, a.source.offset) == where[encode_event(ev)]
        assert a.source.topic == s.topic("text")
        # no image or audio in this stream: no skew estimate, and the alert says so
        assert a.skew_confidence == 0.0 and a.offset_ms == 0.0 and a.ts == a.event_ts == ev.ts
        assert a.window_id == f"mod@{ev.ts // 1_000_000 * 1_000_000}"
        assert placed[("text", a.source.partition, a.source.offset)] == a.window_id
        assert a.kafka_ts_ms > 0 and a.emitted_at >= a.kafka_ts_ms * 1000
    # mmsync moderate, on the same topics: both alerts confirmed by their windows
    join, notes = AlertJoin(), []
    await moderate(s, Report(), timeout_s=6, join=join, on_note=notes.append)
    assert sorted(n.verb for n in notes) == ["ALERT", "ALERT", "CONFIRMED", "CONFIRMED"], notes
    assert join.streams["mod"].confirmed == 2
    text = pipeline.metrics(worker)
    assert re.search(r'mmsync_alerts_total\{kind="term",modality="text"\} 2\.0', text)
    assert re.search(r'mmsync_alert_latency_seconds_count 2\.0', text)
    assert re.search(r'mmsync_alerts_total\{kind="nsfw",modality="image"\} 0\.0', text)


async def test_alerts_carry_the_aligners_skew_estimate(pipeline, tmp_path):
    """Captions 400 ms late on their own clock: once the aligner's estimate reaches the
    text agent (PREFIX.skew, the skew board), the alerts put them back on the image clock."""
    s = pipeline.settings
    await ensure_topics(s)
    # every synthetic caption holds one of these (app/clients/synth.py)
    terms = _terms_file(tmp_path, "欢迎", "产品", "价格", "关注", "支持", "welcome", "camera",
                        "late")
    worker = pipeline.start_worker(MMSYNC_TEXT_EMBEDDING="false", MMSYNC_TERMS_FILES=terms)
    await _wait_ready(pipeline, worker, "load_image")
    skew_us = 400_000
    spec = SynthSpec(stream_id="sk", seconds=30, seed=5, text_skew_us=skew_us,
                     start_us=int(time.time() * 1e6))
    events, _ = synth_events(spec)
    timed = [(e.ts - (skew_us if e.modality == "text" else 0), (e.modality, b"sk",
              encode_event(e))) for e in events]
    timed.sort(key=lambda p: p[0])
    pub = await publish(s, paced(timed), progress=False)
    out = await collect(s, until=lambda o: o.accounted >= pub.total, timeout_s=TIMEOUT)
    assert out.accounted == pub.total, pipeline.logs()
    n_caps = sum(e.modality == "text" for e in events)
    everything = await _alerts(s, lambda a: sum(x.kind == "term" for x in a) >= n_caps)
    # frames may alert too (blind, when the first batches wait on the models' warm-up)
    alerts = [a for a in everything if a.modality == "text"]
    assert len(alerts) == n_caps and {a.kind for a in alerts} == {"term"}
    known = [a for a in alerts if a.skew_confidence > 0]
    print("\nskew per alert (offset ms, confidence): "
          + " ".join(f"{a.offset_ms:+.0f}/{a.skew_confidence:.2f}" for a in alerts))
    assert len(known) >= 4, "the estimate never reached the text agent"
    for a in alerts:
        assert a.ts == max(0, a.event_ts - round(a.offset_ms * 1000))
    settled = known[-3:]
    assert all(abs(a.offset_ms - skew_us / 1000) <= 150 for a in settled), settled
    placed = {(m, p, o): w["id"] for w in out.windows for m, p, o in w["sources"]}
    hits = [placed.get(("text", a.source.partition, a.source.offset)) == a.window_id
            for a in settled]
    assert all(hits), (settled, placed)


async def test_a_degraded_batch_says_which_frames_went_unscored(pipeline):
    """Threshold 0: every scored frame alerts; the frames the degraded image models skipped
    are each in exactly one blind record instead. None is missed without being reported.
    A burst against a 10 ms bound may take the controller straight to level 3 (models
    off, issue 26's jump) as well as through the sampled levels."""
    s = pipeline.settings
    await ensure_topics(s)
    worker = pipeline.start_worker(MMSYNC_AGENTS="image", MMSYNC_CACHE="false",
                                   MMSYNC_ALERT_NSFW="0.0", MMSYNC_DEGRADE_LAG_MS="10")
    await _wait_ready(pipeline, worker, "load_image")
    frames = [FrameEvent(stream_id="bl", ts=i * 100_000, seq=i, data=jpeg_of(chart(200 + i)),
                         fmt="jpeg") for i in range(40)]
    offsets: dict[int, int] = {}
    await publish(s, [("image", b"bl", encode_event(f)) for f in frames], progress=False,
                  on_sent=lambda r, md: offsets.__setitem__(md.offset, 1))

    def covered(alerts: list[Alert]) -> set[int]:
        got = {a.source.offset for a in alerts if a.kind == "nsfw"}
        for a in alerts:
            if a.kind == "blind":
                got |= {o for _, o in a.detail["offsets"]}
        return got

    alerts = await _alerts(s, lambda a: len(covered(a)) >= len(frames))
    blind = [a for a in alerts if a.kind == "blind"]
    scored = [a.source.offset for a in alerts if a.kind == "nsfw"]
    skipped = [o for a in blind for _, o in a.detail["offsets"]]
    print(f"\n{len(scored)} frames scored, {len(skipped)} unscored in {len(blind)} blind records"
          f" at levels {sorted({a.detail['level'] for a in blind})}")
    assert blind, "a 10 ms lag bound on a burst must sample the image models"
    assert sorted(scored + skipped) == sorted(offsets)  # each frame exactly once
    for a in blind:
        d = a.detail
        assert d["level"] >= 1 and d["skipped"] == len(d["offsets"])
        # "off": no frame of the record's stretch was scored (level 3); "sampled": others were
        assert d["reason"] in ("sampled", "off"), d
        assert d["ts_from"] <= d["ts_to"] and a.score == d["skipped"] / d["frames"]
    text = pipeline.metrics(worker)
    counted = re.findall(r'mmsync_alert_skipped_total\{modality="image",reason="(?:sampled|off)"\}'
                         r' ([0-9.]+)', text)
    assert counted and sum(float(c) for c in counted) == len(skipped)
