"""Outputs: the accounting oracle every integration test counts with."""

from __future__ import annotations

from app.clients.collect import Outputs


def win(sid: str, start: int, *sources: tuple[str, int, int]) -> dict:
    counts = {"image": 0, "audio": 0, "text": 0}
    for m, _, _ in sources:
        counts[m] += 1
    return {"id": f"{sid}@{start}", "stream_id": sid, "window_start": start, "counts": counts,
            "sources": [list(s) for s in sources]}


def late(sid: str, modality: str, part: int, off: int) -> dict:
    return {"stream_id": sid, "modality": modality, "src": [part, off]}


def dlq(topic: str, part: int, off: int) -> dict:
    return {"source_topic": topic, "partition": part, "offset": off, "error": "schema"}


def test_each_input_counts_once_wherever_it_came_out():
    o = Outputs()
    o.add("aligned", win("s", 0, ("image", 0, 1), ("audio", 0, 2)))
    o.add("aligned", win("s", 0, ("image", 0, 1), ("audio", 0, 2)))  # replayed as it was
    o.add("aligned", win("s", 1_000_000, ("audio", 0, 2), ("text", 0, 3)))  # audio again
    o.add("late", late("s", "image", 0, 1))  # merged before: not counted again
    o.add("late", late("s", "text", 0, 9))
    o.add("late", late("s", "text", 0, 9))  # the same late event read twice
    o.add("dlq", dlq("mm.image", 0, 4))
    o.add("dlq", dlq("mm.image", 0, 4))
    assert o.duplicate_windows == 1 and o.duplicate_records == 2 and o.duplicate_other == 2
    assert o.merged() == 3 and o.merged("audio") == 1 and o.merged("text") == 1
    assert len(o.windows) == 2 and len(o.late) == 2 and len(o.dlq) == 1
    # image 0/1, audio 0/2, text 0/3 merged; text 0/9 late; one dead letter
    assert o.accounted == 5


def test_window_without_sources_trusts_its_counts():
    o = Outputs()
    w = win("s", 0)
    w["counts"] = {"image": 2, "audio": 1, "text": 0}
    del w["sources"]
    o.add("aligned", w)
    assert o.merged() == 3 and o.merged("image") == 2 and o.accounted == 0
