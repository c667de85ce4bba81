"""Running one Faust worker, in this process or as a child process."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

from app.settings import Settings

__all__ = ["run_worker", "spawn_worker", "stop_process", "worker_env"]


def run_worker(s: Settings) -> None:
    """Block running one worker with the agents ``s.agents`` selects."""
    import faust

    from agents import register_all
    from app.kafka.clients import wait_for_broker
    from app.runtime.faust_app import make_app

    logging.basicConfig(level=s.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # Bounded retries with backoff and one clear message, instead of Faust's
    # endless reconnect loop when the broker is not there at all.
    asyncio.run(wait_for_broker(s, timeout_s=s.broker_wait_s))
    if "text" in s.enabled_agents:
        import jieba

        jieba.setLogLevel(logging.WARNING)
        jieba.initialize()  # 1.4 s once; before the agents so the first caption is not slow
    s.data_dir.mkdir(parents=True, exist_ok=True)
    rt = make_app(s)
    register_all(rt)
    worker = faust.Worker(rt.app, loglevel=s.log_level.upper(), quiet=True,
                          override_logging=False)
    worker.execute_from_commandline()


def worker_env(s: Settings, **extra: str) -> dict[str, str]:
    """``MMSYNC_*`` variables giving a child worker the broker, topics, data dir and models
    of ``s``, on a free metrics port; ``extra`` (``MMSYNC_X="..."``) on top."""
    from app.kafka.embedded import free_port

    env = {"MMSYNC_BROKER": s.broker or "",
           "MMSYNC_BROKER_EMBEDDED": "1" if s.broker_embedded else "0",
           "MMSYNC_TOPIC_PREFIX": s.topic_prefix, "MMSYNC_PARTITIONS": str(s.partitions),
           "MMSYNC_DATA_DIR": str(s.data_dir), "MMSYNC_MODELS": s.models,
           "MMSYNC_WEB_PORT": str(free_port())}
    if s.models_dir is not None:
        env["MMSYNC_MODELS_DIR"] = str(s.models_dir)
    env.update(extra)
    return env


def spawn_worker(env: dict[str, str], log_path: Path | None = None, *,
                 module: str = "app.cli", args: tuple[str, ...] = ("worker",)
                 ) -> subprocess.Popen[bytes]:
    """Start ``python -m module args`` (by default ``mmsync worker``) as a child in its own
    process group, with ``MMSYNC_*`` settings from ``env``, output to ``log_path``."""
    full = {**os.environ, **env}
    out = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115
    return subprocess.Popen([sys.executable, "-m", module, *args], env=full, stdout=out,
                            stderr=subprocess.STDOUT, start_new_session=True)


def stop_process(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM,
                 timeout_s: float = 20.0) -> None:
    """Signal a child's process group, wait, and SIGKILL it if it does not exit."""
    if proc.poll() is None:
        os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
