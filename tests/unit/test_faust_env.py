"""A worker's Faust app takes its settings from mmsync's Settings (MMSYNC_* variables)
only: Faust's own unprefixed environment variables (BROKER_URL, WEB_PORT, ...) win over
what it is given unless it gets an empty environment (app.runtime.faust_app.make_app)."""

from __future__ import annotations

from app.runtime.faust_app import make_app
from app.settings import Settings


def test_faust_reads_no_setting_of_its_own_from_the_environment(tmp_path, monkeypatch):
    # Faust takes BROKER_URL, WEB_PORT, ... from the environment over what it is given;
    # a worker's settings come from MMSYNC_* only (app.settings)
    for name, value in (("BROKER_URL", "kafka://elsewhere:1"), ("WEB_PORT", "1234"),
                        ("BROKER_COMMIT_EVERY", "7"), ("STREAM_WAIT_EMPTY", "true")):
        monkeypatch.setenv(name, value)
    conf = make_app(Settings(data_dir=tmp_path, broker="kafka://127.0.0.1:9")).app.conf
    assert [str(u) for u in conf.broker] == ["kafka://127.0.0.1:9"]
    assert conf.web_port == Settings(data_dir=tmp_path).web_port
    assert conf.broker_commit_every == 10_000  # Faust's default
    assert conf.stream_wait_empty is False
