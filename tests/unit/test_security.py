"""Security checks without a broker: no unsafe deserialisation, input limits, defaults, auth."""

from __future__ import annotations

import ast
import ssl
from pathlib import Path
from typing import Any

import msgpack
import pytest

from app.errors import InvalidInputError
from app.settings import Settings
from schemas.events import Limits, decode_event
from tests.helpers import jpeg_bytes

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted(p for d in ("app", "agents", "schemas") for p in (ROOT / d).rglob("*.py"))

#: Modules that turn bytes into arbitrary objects (code execution on load).
_UNSAFE_MODULES = {"pickle", "cPickle", "_pickle", "marshal", "dill", "shelve", "cloudpickle",
                   "joblib", "jsonpickle"}
_UNSAFE_CALLS = {"eval", "exec", "compile", "__import__"}


def _problems(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    out: list[str] = []
    where = path.name
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [f"{where}:{node.lineno} import {a.name}" for a in node.names
                    if a.name.split(".")[0] in _UNSAFE_MODULES]
        elif isinstance(node, ast.ImportFrom):
            if (node.module or "").split(".")[0] in _UNSAFE_MODULES:
                out.append(f"{where}:{node.lineno} from {node.module} import")
        elif isinstance(node, ast.Call):
            f = node.func
            kwargs = {k.arg: k.value for k in node.keywords}
            if isinstance(f, ast.Name) and f.id in _UNSAFE_CALLS:
                out.append(f"{where}:{node.lineno} {f.id}()")
            elif isinstance(f, ast.Attribute):
                owner = f.value.id if isinstance(f.value, ast.Name) else None
                if owner == "builtins" and f.attr in _UNSAFE_CALLS:
                    out.append(f"{where}:{node.lineno} builtins.{f.attr}()")
                # yaml.load / load_all without a safe loader
                if owner == "yaml" and f.attr in ("load", "load_all", "unsafe_load",
                                                   "full_load"):
                    loader = kwargs.get("Loader") or (node.args[1] if len(node.args) > 1
                                                      else None)
                    name = ast.unparse(loader) if loader is not None else ""
                    if "Safe" not in name:
                        out.append(f"{where}:{node.lineno} yaml.{f.attr} without SafeLoader")
                # numpy / torch loaders that unpickle
                if f.attr == "load" and owner in ("np", "numpy"):
                    ap = kwargs.get("allow_pickle")
                    if isinstance(ap, ast.Constant) and ap.value is True:
                        out.append(f"{where}:{node.lineno} np.load(allow_pickle=True)")
                if f.attr == "load" and owner == "torch":
                    wo = kwargs.get("weights_only")
                    if not (isinstance(wo, ast.Constant) and wo.value is True):
                        out.append(f"{where}:{node.lineno} torch.load without weights_only")
                # a shell on anything built from data
                if owner == "subprocess" or f.attr in ("system", "popen"):
                    sh = kwargs.get("shell")
                    if (f.attr in ("system", "popen") and owner == "os") or (
                            isinstance(sh, ast.Constant) and sh.value is True):
                        out.append(f"{where}:{node.lineno} shell command")
    return out


def test_sources_found() -> None:
    assert len(SOURCES) > 20
    names = {p.name for p in SOURCES}
    assert {"codec.py", "events.py", "features.py", "aligner.py"} <= names


def test_no_unsafe_deserialisation_or_eval_on_any_path() -> None:
    problems = [p for path in SOURCES for p in _problems(path)]
    assert not problems, "\n".join(problems)


def test_the_scanner_catches_what_it_should(tmp_path: Path) -> None:
    bad = tmp_path / "probe.py"
    src = ("import pickle\nfrom marshal import loads\nimport yaml\nimport numpy as np\n"
           "eval('1')\nexec('x=1')\nyaml.load(b'')\nyaml.load(b'', Loader=yaml.SafeLoader)\n"
           "np.load('f', allow_pickle=True)\nnet.eval()\n")
    bad.write_text(src)
    found = _problems(bad)
    kinds = sorted(x.split(" ", 1)[1] for x in found)
    assert kinds == ["eval()", "exec()", "from marshal import", "import pickle",
                     "np.load(allow_pickle=True)", "yaml.load without SafeLoader"]


# --- input size limits, against the contract ---------------------------------------

def _raw(**fields: Any) -> bytes:
    return msgpack.packb({"v": 1, "stream_id": "s", "ts": 1, **fields}, use_bin_type=True)


def _reason(modality: str, raw: bytes, key: bytes | None = b"s",
            limits: Limits | None = None) -> str:
    with pytest.raises(InvalidInputError) as ei:
        decode_event(modality, key, raw, limits)
    return ei.value.reason


def test_limits_default_to_the_contract() -> None:
    lim, s = Limits(), Settings()
    assert lim.max_text_bytes == s.max_text_bytes == 64 * 1024
    assert lim.max_image_bytes == s.max_image_bytes == 8 * 1024 * 1024
    assert 0 < lim.max_audio_bytes == s.max_audio_bytes <= 16 * 1024 * 1024


@pytest.mark.parametrize("n", [0, 257, 10_000])
def test_stream_id_length_outside_1_to_256(n: int) -> None:
    sid = "x" * n
    raw = msgpack.packb({"v": 1, "stream_id": sid, "ts": 1, "text": "hi"})
    assert _reason("text", raw, key=sid.encode()) == "schema"


@pytest.mark.parametrize("n", [1, 256])
def test_stream_id_length_at_the_bounds_is_fine(n: int) -> None:
    sid = "é" * n  # characters, not bytes
    raw = msgpack.packb({"v": 1, "stream_id": sid, "ts": 1, "text": "hi"})
    assert decode_event("text", sid.encode(), raw).stream_id == sid


def test_text_limit_is_64_kib_of_utf8() -> None:
    ok = "a" * (64 * 1024)
    assert decode_event("text", b"s", _raw(text=ok)).text == ok
    assert _reason("text", _raw(text=ok + "a")) == "too_large"
    # 3 bytes per character: 21,846 characters are 65,538 bytes
    assert _reason("text", _raw(text="中" * 21_846)) == "too_large"


def test_image_limit_is_8_mib() -> None:
    jpg = jpeg_bytes()
    big = jpg + b"\0" * (8 * 1024 * 1024 - len(jpg) + 1)
    assert _reason("image", _raw(data=big)) == "too_large"
    exact = jpg + b"\0" * (8 * 1024 * 1024 - len(jpg))
    assert len(decode_event("image", b"s", _raw(data=exact)).data) == 8 * 1024 * 1024
    # the envelope is refused before msgpack even decodes it
    assert _reason("image", _raw(data=big) + b"\0" * 8192) == "too_large"


def test_audio_limits() -> None:
    lim = Limits()
    pcm = b"\0\0" * 160
    assert decode_event("audio", b"s", _raw(data=pcm, sr=8000)).sr == 8000
    assert decode_event("audio", b"s", _raw(data=pcm, sr=48000)).sr == 48000
    for sr in (7999, 48001, 0, -1, 10**12):
        assert _reason("audio", _raw(data=pcm, sr=sr)) == "bad_audio", sr
    for ch in (0, 9, -1):
        assert _reason("audio", _raw(data=pcm, sr=16000, ch=ch)) == "bad_audio", ch
    assert decode_event("audio", b"s", _raw(data=b"\0" * 16, sr=16000, ch=8)).ch == 8
    big = b"\0" * (lim.max_audio_bytes + 2)
    assert _reason("audio", _raw(data=big, sr=16000)) == "too_large"
    assert _reason("audio", _raw(data=b"\0" * 3, sr=16000)) == "bad_audio"  # odd length


def test_optional_strings_are_bounded() -> None:
    assert _reason("text", _raw(text="a", trace_id="t" * 129)) == "too_large"
    assert _reason("text", _raw(text="a", lang="x" * 36)) == "schema"


def test_settings_lower_limits_apply() -> None:
    lim = Limits(max_text_bytes=10, max_image_bytes=1000, max_audio_bytes=100)
    assert _reason("text", _raw(text="a" * 11), limits=lim) == "too_large"
    assert _reason("image", _raw(data=jpeg_bytes() + b"\0" * 1000), limits=lim) == "too_large"
    assert _reason("audio", _raw(data=b"\0" * 102, sr=16000), limits=lim) == "too_large"


def test_msgpack_bombs_are_refused() -> None:
    # a map header announcing 2**32 - 1 entries, an array of 2**32 - 1, a deep nest
    for raw in (b"\xdf\xff\xff\xff\xff", b"\xdd\xff\xff\xff\xff", b"\x91" * 100_000):
        assert _reason("text", raw) in ("bad_msgpack", "schema")


# --- network defaults ------------------------------------------------------------

def test_metrics_server_defaults_to_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MMSYNC_WEB_HOST", raising=False)
    assert Settings().web_host == "127.0.0.1"


# --- Kafka SSL / SASL wiring -----------------------------------------------------

@pytest.fixture
def cafile_seen(monkeypatch: pytest.MonkeyPatch) -> list[str | None]:
    """Record the CA file each SSL context is built from (no real CA needed)."""
    seen: list[str | None] = []

    def fake(purpose: Any = ssl.Purpose.SERVER_AUTH, *, cafile: str | None = None,
             **_: Any) -> ssl.SSLContext:
        seen.append(cafile)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.mmsync_cafile = cafile  # type: ignore[attr-defined]
        return ctx

    monkeypatch.setattr(ssl, "create_default_context", fake)
    return seen


def _sasl_ssl_settings(tmp_path: Path, mechanism: str = "SCRAM-SHA-512") -> Settings:
    return Settings(broker="kafka://broker.example:9093", data_dir=tmp_path,
                    security_protocol="SASL_SSL", sasl_mechanism=mechanism,
                    sasl_username="alice", sasl_password="s3cret",
                    ssl_cafile=tmp_path / "ca.pem")


def test_password_is_a_secret(tmp_path: Path) -> None:
    s = _sasl_ssl_settings(tmp_path)
    assert "s3cret" not in repr(s) and "s3cret" not in str(s.model_dump())


def test_auth_kwargs_sasl_ssl(tmp_path: Path, cafile_seen: list[str | None]) -> None:
    from app.kafka.clients import auth_kwargs

    kw = auth_kwargs(_sasl_ssl_settings(tmp_path))
    assert kw["security_protocol"] == "SASL_SSL"
    assert kw["sasl_mechanism"] == "SCRAM-SHA-512"
    assert kw["sasl_plain_username"] == "alice" and kw["sasl_plain_password"] == "s3cret"
    assert kw["ssl_context"].mmsync_cafile == str(tmp_path / "ca.pem")
    assert auth_kwargs(Settings(data_dir=tmp_path)) == {"security_protocol": "PLAINTEXT"}


async def test_aiokafka_clients_get_the_credentials(tmp_path: Path,
                                                   cafile_seen: list[str | None]) -> None:
    from app.kafka.clients import make_consumer, make_producer

    s = _sasl_ssl_settings(tmp_path)
    producer = make_producer(s)
    consumer = make_consumer(s, "t")
    try:
        for client in (producer.client, consumer._client):
            assert client._security_protocol == "SASL_SSL"
            assert client._sasl_mechanism == "SCRAM-SHA-512"
            assert client._sasl_plain_username == "alice"
            assert client._sasl_plain_password == "s3cret"
            assert client._ssl_context.mmsync_cafile == str(tmp_path / "ca.pem")
            assert client._bootstrap_servers == "broker.example:9093"
    finally:
        await consumer.stop()  # never started: only closes what the constructor made
        await producer.stop()


@pytest.mark.parametrize("protocol", ["SASL_SSL", "SASL_PLAINTEXT", "SSL"])
def test_faust_gets_the_credentials(tmp_path: Path, protocol: str,
                                    cafile_seen: list[str | None]) -> None:
    from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

    from app.runtime.faust_app import make_app

    s = _sasl_ssl_settings(tmp_path, "PLAIN").model_copy(
        update={"security_protocol": protocol})
    rt = make_app(s)
    # what Faust's aiokafka driver passes to its consumers and producer
    kw = credentials_to_aiokafka_auth(rt.app.conf.broker_credentials, rt.app.conf.ssl_context)
    assert kw["security_protocol"] == protocol
    if protocol.startswith("SASL"):
        assert kw["sasl_mechanism"] == "PLAIN"
        assert kw["sasl_plain_username"] == "alice" and kw["sasl_plain_password"] == "s3cret"
    if protocol.endswith("SSL"):
        assert kw["ssl_context"].mmsync_cafile == str(tmp_path / "ca.pem")
    else:
        assert kw.get("ssl_context") is None


@pytest.mark.parametrize("v", [1.0, True, "1", None, 2, 0])
def test_version_must_be_exactly_int_1(v: Any) -> None:
    raw = msgpack.packb({"v": v, "stream_id": "s", "ts": 1, "text": "hi"})
    assert _reason("text", raw) == "bad_version"


def test_mutual_tls_client_certificate_and_hostname_switch(tmp_path: Path) -> None:
    """A real self-signed certificate and key (openssl) load into every client's context."""
    import shutil
    import subprocess

    from app.kafka.clients import auth_kwargs, ssl_context

    if shutil.which("openssl") is None:
        pytest.skip("openssl not installed")
    cert, key = tmp_path / "client.pem", tmp_path / "client.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=mmsync-test", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    s = Settings(security_protocol="SSL", ssl_cafile=cert, ssl_certfile=cert, ssl_keyfile=key,
                 ssl_check_hostname=False)
    ctx = ssl_context(s)
    assert ctx.check_hostname is False and ctx.verify_mode == ssl.CERT_REQUIRED
    assert auth_kwargs(s)["ssl_context"].check_hostname is False
    assert ssl_context(s.model_copy(update={"ssl_check_hostname": True})).check_hostname
    with pytest.raises(ssl.SSLError):
        ssl_context(s.model_copy(update={"ssl_keyfile": cert}))  # a certificate is no key
