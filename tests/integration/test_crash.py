"""A worker SIGKILLed in the middle of a multimodal stream loses no window."""

from __future__ import annotations

import signal
from collections import Counter

import pytest

from app.clients.collect import collect
from app.clients.produce import publish
from app.clients.synth import SynthSpec, synth_records
from app.kafka.clients import create_topics
from app.runtime.process import stop_process

pytestmark = pytest.mark.integration


async def test_sigkill_mid_stream_then_restart_loses_nothing(pipeline):
    s = pipeline.settings
    await create_topics(s)
    first = pipeline.start_worker(MMSYNC_MODELS="light")
    specs = [SynthSpec(stream_id=f"crash-{i}", seconds=12, fps=10, audio_skew_us=sk,
                       jitter_us=10_000, seed=20 + i) for i, sk in enumerate((-200_000, 300_000))]
    recs = list(synth_records(specs))
    half = len(recs) // 2
    pub1 = await publish(s, recs[:half], progress=False)
    # some windows are out, others still open, when the worker dies
    seen = await collect(s, until=lambda o: len(o.windows) >= 4, timeout_s=60)
    assert len(seen.windows) >= 4, pipeline.logs()
    stop_process(first, sig=signal.SIGKILL)
    pipeline.start_worker(MMSYNC_MODELS="light")
    pub2 = await publish(s, recs[half:], progress=False)
    total = pub1.total + pub2.total
    out = await collect(s, until=lambda o: o.accounted >= total, timeout_s=120)
    print(f"\ncrash: sent {total}, merged {out.merged()}, late {len(out.late)}, "
          f"windows {len(out.windows)}, replayed windows dropped {out.duplicate_windows}, "
          f"duplicate records dropped {out.duplicate_records}")
    assert out.accounted == total, pipeline.logs()
    sent = Counter(m for m, _, _ in recs)
    for m in ("image", "audio", "text"):
        assert out.merged(m) + sum(1 for x in out.late if x["modality"] == m) == sent[m]
