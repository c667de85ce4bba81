"""Peak RSS of one process with the full models warm and a few items of each modality
run through them (CPU): the models' share of a worker's memory (docs/operations.md).

    .venv/bin/python scripts/measure_rss.py
"""

from __future__ import annotations

import resource
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.features.pipeline import FeaturePipeline  # noqa: E402
from app.settings import Settings  # noqa: E402
from schemas.events import TextEvent  # noqa: E402
from tests.helpers import audio_chunk, chart, frame_event, speechlike  # noqa: E402


def main() -> None:
    p = FeaturePipeline(Settings(data_dir=Path(tempfile.mkdtemp()), device="cpu", cache=False))
    for m in ("image", "audio", "text"):
        p.warm(m)
    p.extractor("image").run([frame_event(chart(i), "s", i) for i in range(4)])
    p.extractor("audio").run([audio_chunk(speechlike(secs=0.1), 16000)])
    p.extractor("text").run([TextEvent(stream_id="t", ts=0, text="今天天气很好")])
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
