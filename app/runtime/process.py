"""Running one Faust worker, in this process or as a child process."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

from pydantic import SecretStr

from app.runtime.children import die_with_parent
from app.settings import Settings

__all__ = ["peak_rss_bytes", "run_worker", "spawn_worker", "stop_process", "worker_env"]

log = logging.getLogger("mmsync")


def run_worker(s: Settings) -> None:
    """Block running one worker with the agents ``s.agents`` selects.

    One ordered start: the broker reachable, the models loaded (the first time: built),
    then the Faust worker, which joins the group and takes partitions."""
    import time

    import faust

    from agents import register_all
    from app.kafka.clients import wait_for_broker
    from app.kafka.topics import ensure_topics
    from app.runtime.faust_app import make_app

    t_start = time.monotonic()
    logging.basicConfig(level=s.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # Bounded retries with backoff and one clear message, instead of Faust's
    # endless reconnect loop when the broker is not there at all.
    asyncio.run(wait_for_broker(s, timeout_s=s.broker_wait_s))
    # Every topic made or checked before any agent, timer or send starts (issue 23): a
    # wrong partition count raises TopicConfigError, one line from the CLI, exit 1.
    asyncio.run(ensure_topics(s))
    if "text" in s.enabled_agents:
        import jieba

        jieba.setLogLevel(logging.WARNING)
        jieba.initialize()  # 1.4 s once; before the agents so the first caption is not slow
    s.data_dir.mkdir(parents=True, exist_ok=True)
    rt = make_app(s)
    if rt.readiness is not None:
        rt.readiness.started = t_start
    register_all(rt)
    # Models before the group: a worker that joined first took partitions it could not
    # serve while it built its models (39 s on a fresh data dir), and their frames went
    # late (issue 29). Faust's web port (metrics, /ready) opens after this.
    log.info("loading models (%s) before joining the group", ", ".join(rt.loaders) or "none")
    took = rt.load_models()
    log.info("models loaded in %.1f s; joining the group", took)
    worker = faust.Worker(rt.app, loglevel=s.log_level.upper(), quiet=True,
                          override_logging=False)
    worker.execute_from_commandline()


def _env_value(v: object) -> str:
    if isinstance(v, SecretStr):
        return v.get_secret_value()
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def worker_env(s: Settings, **extra: str) -> dict[str, str]:
    """Every setting of ``s`` as the ``MMSYNC_*`` variable a child worker reads it from
    (unset ones left out), on a free metrics port; ``extra`` (``MMSYNC_X="..."``) on top.
    With :func:`spawn_worker`, the child's settings are exactly ``s``'s."""
    from app.kafka.embedded import free_port

    env = {f"MMSYNC_{name.upper()}": _env_value(value)
           for name, value in s.model_dump().items() if value is not None}
    env["MMSYNC_WEB_PORT"] = str(free_port())
    env.update(extra)
    return env


def spawn_worker(env: dict[str, str], log_path: Path | None = None, *,
                 module: str = "app.cli", args: tuple[str, ...] = ("worker",)
                 ) -> subprocess.Popen[bytes]:
    """Start ``python -m module args`` (by default ``mmsync worker``) as a child in its own
    process group, with ``MMSYNC_*`` settings from ``env`` only (the parent's own
    ``MMSYNC_*`` variables are not inherited: :func:`worker_env` passes them all),
    output to ``log_path``. It gets SIGTERM if this process dies first
    (:func:`~app.runtime.children.die_with_parent`)."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("MMSYNC_")}
    full.update(env)
    out = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115
    return subprocess.Popen(die_with_parent([sys.executable, "-m", module, *args]), env=full,
                            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def peak_rss_bytes(pid: int) -> int:
    """Peak resident memory of a live process (Linux ``VmHWM``), bytes; 0 if unknown."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


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
