"""``mmsync``: demo, worker, broker, produce, tail, moderate.

Every ``MMSYNC_*`` setting is read by :class:`app.settings.Settings`; the flags
below override the ones that fit a flag.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from app.errors import MmsyncError
from app.kafka.apache import DEFAULT_KAFKA_VERSION
from app.settings import Settings

__all__ = ["main"]


def _settings(args: argparse.Namespace) -> Settings:
    upd: dict[str, Any] = {}
    for name in ("broker", "topic_prefix", "partitions", "web_port", "agents", "data_dir"):
        val = getattr(args, name, None)
        if val is not None:
            upd[name] = val
    s = Settings()
    return s.model_copy(update=upd) if upd else s


def _client_settings(args: argparse.Namespace) -> Settings | None:
    """Settings of a command that talks to a running broker; None (after saying so)
    when none is named: those commands start no embedded broker of their own."""
    s = _settings(args)
    if not s.broker:
        print(f"mmsync {args.cmd}: set MMSYNC_BROKER or --broker", file=sys.stderr)
        return None
    return s


def _settings_epilog() -> str:
    lines = ["settings (environment):"]
    for name, f in Settings.model_fields.items():
        default = "" if f.default_factory is not None else f" (default {f.default!r})"
        desc = f" - {f.description}" if f.description else ""
        lines.append(f"  MMSYNC_{name.upper()}{default}{desc}")
    return "\n".join(lines)


def _cmd_demo(args: argparse.Namespace) -> int:
    from app.clients.demo import run_demo

    return run_demo(_settings(args), seconds=args.seconds, timeout_s=args.timeout)


def _cmd_worker(args: argparse.Namespace) -> int:
    from app.runtime.process import run_worker

    s = _settings(args)
    if not s.broker:
        print("mmsync worker: set MMSYNC_BROKER (e.g. kafka://127.0.0.1:9092) or --broker; "
              "'mmsync broker' starts an embedded one", file=sys.stderr)
        return 2
    sys.argv = [sys.argv[0], "worker"]  # Faust's Worker parses argv itself
    run_worker(s)
    return 0


def _stop_on_signal() -> Callable[[], bool]:
    """From now on SIGTERM and SIGINT (Ctrl-C) only set a flag; the returned function
    reads it. Installed before the export line is printed, so a signal sent as soon
    as it is read still ends the command cleanly (exit 0)."""
    stop = False

    def _sig(*_a: Any) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _sig)
    signal.signal(signal.SIGINT, _sig)
    return lambda: stop


def _wait(stopped: Callable[[], bool], alive: Callable[[], bool]) -> None:
    while not stopped() and alive():
        time.sleep(0.2)


def _cmd_broker(args: argparse.Namespace) -> int:
    if args.kafka:
        return _broker_kafka(args)
    from app.kafka.embedded import EmbeddedBroker

    with EmbeddedBroker(port=args.port) as b:
        stopped = _stop_on_signal()
        print(f"embedded broker (Tansu, in memory) on {b.bootstrap}")
        print(f"  export MMSYNC_BROKER={b.url} MMSYNC_BROKER_EMBEDDED=1", flush=True)
        _wait(stopped, b.alive)
    return 0


def _broker_kafka(args: argparse.Namespace) -> int:
    from app.kafka.apache import KafkaNode

    # SIGTERM while the node starts (seconds) stops it as Ctrl-C does: KafkaNode.start
    # stops what it started before the exception leaves it.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    with KafkaNode(port=args.port, version=args.kafka_version) as k:
        stopped = _stop_on_signal()
        print(f"Apache Kafka {k.version} (KRaft, one node, topic auto-creation off) on "
              f"{k.bootstrap}, ready in {k.start_s:.1f} s; log {k.log_file}")
        print(f"  export MMSYNC_BROKER={k.url}", flush=True)
        _wait(stopped, k.alive)
        if not stopped():
            print(f"mmsync broker: Kafka exited on its own:\n{k.tail()}", file=sys.stderr)
            return 1
    return 0


def _cmd_produce(args: argparse.Namespace) -> int:
    from app.clients.produce import (
        image_records,
        paced,
        publish,
        srt_records,
        text_records,
        wav_records,
    )
    from app.clients.synth import SynthSpec, synth_records
    from app.kafka.topics import ensure_topics

    s = _client_settings(args)
    if s is None:
        return 2
    start = args.start_us if args.start_us is not None else time.time_ns() // 1000
    sid = args.stream_id
    recs: list[Any] = []
    if args.synthetic:
        specs = [SynthSpec(stream_id=f"{sid}-{i}" if args.streams > 1 else sid,
                           seconds=args.seconds, seed=i + 1, start_us=start,
                           audio_skew_us=args.audio_skew_ms * 1000)
                 for i in range(args.streams)]
        recs.extend(synth_records(specs))
    if args.image:
        recs.extend(image_records([Path(p) for p in args.image], sid, start, args.fps or 5.0))
    if args.wav:
        recs.extend(wav_records(Path(args.wav), sid, start, args.chunk_ms))
    if args.text:
        recs.extend(text_records(args.text, sid, start))
    if args.text_file:
        recs.extend(text_records(Path(args.text_file).read_text("utf-8").splitlines(), sid,
                                 start))
    if args.srt and not args.video:  # with --video the captions join the video's stream
        recs.extend(srt_records(Path(args.srt), sid, start))
    video: Any = None
    total = len(recs)
    if args.video:
        from app.clients.media import probe, video_records

        info = probe(Path(args.video))  # a clear error before anything is sent
        fps = 10.0 if args.fps is None else args.fps
        video = video_records(Path(args.video), sid, start, fps=fps or None,
                              chunk_ms=args.chunk_ms, max_side=args.max_side,
                              srt=Path(args.srt) if args.srt else None,
                              embedded_subs=not args.no_embedded_subs, timed=args.realtime)
        total += info.estimate(fps or None, args.chunk_ms)
    if not recs and video is None:
        print("mmsync produce: nothing to publish (see --help)", file=sys.stderr)
        return 2
    asyncio.run(ensure_topics(s))
    by_modality: dict[str, int] = {}
    if recs or not args.realtime:
        stream = recs if video is None or args.realtime else itertools.chain(recs, video)
        pub = asyncio.run(publish(s, stream, total=total, progress=not args.quiet))
        by_modality.update(pub.by_modality)
    if video is not None and args.realtime:
        pub = asyncio.run(publish(s, paced(video, args.speed), total=total - len(recs),
                                  progress=not args.quiet))
        for m, n in pub.by_modality.items():
            by_modality[m] = by_modality.get(m, 0) + n
    print(f"published {sum(by_modality.values())} records: {by_modality}")
    return 0


def _cmd_tail(args: argparse.Namespace) -> int:
    from app.clients.collect import Outputs, collect
    from app.clients.render import alert_json, render_alert, render_window, window_json

    s = _client_settings(args)
    if s is None:
        return 2

    def until(o: Outputs) -> bool:
        return args.count is not None and len(o.windows) >= args.count

    def show(w: dict[str, Any]) -> None:
        print(window_json(w, full=args.full) if args.json else render_window(w), flush=True)

    def show_alert(a: dict[str, Any]) -> None:
        print(alert_json(a) if args.json else render_alert(a), flush=True)

    out = asyncio.run(collect(s, until=until, timeout_s=args.timeout, on_window=show,
                              on_alert=show_alert if args.alerts else None))
    summary = f"{len(out.windows)} windows, {len(out.late)} late, {len(out.dlq)} dead letters"
    if args.alerts:
        summary += f", {len(out.alerts)} alerts"
    print(summary, file=sys.stderr if args.json else sys.stdout)
    return 0


def _cmd_moderate(args: argparse.Namespace) -> int:
    from rich.console import Console

    from app.clients.alertjoin import AlertJoin
    from app.clients.moderate import Report, Thresholds, moderate

    s = _client_settings(args)
    if s is None:
        return 2
    nsfw = None if args.nsfw_threshold < 0 else args.nsfw_threshold
    report = Report(thresholds=Thresholds(nsfw=nsfw, terms=args.terms))
    join = None if args.no_alerts else AlertJoin()
    try:
        asyncio.run(moderate(s, report, count=args.count, timeout_s=args.timeout,
                             on_flag=lambda f: print(f.line(), flush=True), join=join,
                             on_note=lambda n: print(n.line(), flush=True)))
    except KeyboardInterrupt:
        pass  # Ctrl-C ends the watch; the report below is the point
    console = Console()
    if join is not None:
        console.print(join.table())
    console.print(report.table())
    return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mmsync", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=_settings_epilog())
    sub = p.add_subparsers(dest="cmd", required=True)

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--broker", help="[env: MMSYNC_BROKER] kafka://host:port")
        sp.add_argument("--topic-prefix", help="[env: MMSYNC_TOPIC_PREFIX] default mm")
        sp.add_argument("--partitions", type=int, help="[env: MMSYNC_PARTITIONS] default 8")

    d = sub.add_parser("demo", help="the main job on the embedded broker")
    common(d)
    d.add_argument("--seconds", type=float, default=20.0,
                   help="media seconds per stream (enough for the skew estimate to settle)")
    d.add_argument("--timeout", type=float, default=120.0)
    d.set_defaults(fn=_cmd_demo)

    w = sub.add_parser("worker", help="one Faust worker")
    common(w)
    w.add_argument("--web-port", type=int, help="[env: MMSYNC_WEB_PORT] metrics port")
    w.add_argument("--agents", help="[env: MMSYNC_AGENTS] text,image,audio,aligner or all")
    w.add_argument("--data-dir", type=Path, help="[env: MMSYNC_DATA_DIR]")
    w.set_defaults(fn=_cmd_worker)

    b = sub.add_parser("broker", help="the embedded broker (--kafka: Apache Kafka) in the"
                       " foreground; prints the MMSYNC_BROKER to export")
    b.add_argument("--port", type=int, default=None, help="default: a free loopback port")
    b.add_argument("--kafka", action="store_true",
                   help="a local Apache Kafka node (KRaft) from the jars `make kafka` fetched;"
                        " needs a JDK (17 or newer)")
    b.add_argument("--kafka-version", default=DEFAULT_KAFKA_VERSION,
                   help=f"with --kafka: which fetched version (default {DEFAULT_KAFKA_VERSION})")
    b.set_defaults(fn=_cmd_broker)

    pr = sub.add_parser("produce", help="publish media to the input topics")
    common(pr)
    pr.add_argument("--stream-id", default="cli-1")
    pr.add_argument("--synthetic", action="store_true", help="a built-in co-occurring stream")
    pr.add_argument("--streams", type=int, default=1)
    pr.add_argument("--seconds", type=float, default=10.0)
    pr.add_argument("--audio-skew-ms", type=int, default=0)
    pr.add_argument("--image", nargs="*", help="JPEG/PNG files, as frames at --fps")
    pr.add_argument("--video", help="a media file (video, audio, embedded subtitles) via PyAV")
    pr.add_argument("--fps", type=float, default=None,
                    help="frame rate: --image default 5; --video resamples to it by"
                         " presentation time, default 10, 0 keeps every frame")
    pr.add_argument("--chunk-ms", type=int, default=100, help="audio chunk length (--video, --wav)")
    pr.add_argument("--max-side", type=int, default=640,
                    help="--video frames are scaled to at most this many pixels a side")
    pr.add_argument("--no-embedded-subs", action="store_true",
                    help="ignore the container's subtitle stream (--srt replaces it anyway)")
    pr.add_argument("--realtime", action="store_true", help="pace --video at its media time")
    pr.add_argument("--speed", type=float, default=1.0, help="--realtime speed-up factor")
    pr.add_argument("--wav", help="a 16-bit PCM WAV file")
    pr.add_argument("--text", nargs="*", help="text events, one per second")
    pr.add_argument("--text-file", help="one text event per line")
    pr.add_argument("--srt", help="subtitles (.srt); with --video, its sidecar captions")
    pr.add_argument("--start-us", type=int, default=None, help="ts of the first item")
    pr.add_argument("--quiet", action="store_true")
    pr.set_defaults(fn=_cmd_produce)

    t = sub.add_parser("tail", help="print mm.aligned (and with --alerts mm.alerts) readably")
    common(t)
    t.add_argument("--count", type=int, default=None, help="stop after N windows")
    t.add_argument("--timeout", type=float, default=3600.0)
    t.add_argument("--json", action="store_true",
                   help="one JSON line per window (bytes as base64; no embeddings unless --full)")
    t.add_argument("--full", action="store_true", help="with --json: keep the grid embeddings")
    t.add_argument("--alerts", action="store_true", help="show mm.alerts too, as they come")
    t.set_defaults(fn=_cmd_tail)

    mo = sub.add_parser("moderate", help="report alerts live, confirm or clear them by their"
                        " windows; flag windows; report per stream")
    common(mo)
    mo.add_argument("--nsfw-threshold", type=float, default=0.8,
                    help="flag a window whose highest NSFW score is at least this; -1: never")
    mo.add_argument("--terms", action="store_true", help="flag windows with sensitive terms")
    mo.add_argument("--no-alerts", action="store_true", help="read mm.aligned only (no alerts)")
    mo.add_argument("--count", type=int, default=None, help="stop after N windows")
    mo.add_argument("--timeout", type=float, default=3600.0, help="stop after S seconds")
    mo.set_defaults(fn=_cmd_moderate)
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return int(args.fn(args))
    except MmsyncError as exc:
        print(f"mmsync {args.cmd}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
