"""The one settings object, read from ``MMSYNC_*`` environment variables once.

Every field is documented with its variable; ``mmsync --help`` shows them.
Tests build ``Settings(data_dir=tmp_path, ...)`` directly.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["MODALITIES", "Settings", "default_cache_bytes"]

#: The input modalities, in the order the aligner reports them.
MODALITIES: tuple[str, ...] = ("image", "audio", "text")


def _memory_bytes() -> int:
    """Physical memory, or the container's cgroup limit (v2 ``memory.max``) when lower."""
    try:
        phys = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        phys = 4 << 30
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
    except OSError:
        return int(phys)
    return int(min(phys, int(limit))) if limit.isdigit() else int(phys)


def default_cache_bytes() -> int:
    """A sixteenth of memory (the container's limit if it has one), at most 2 GiB:
    features are small and the models need the rest."""
    return int(min(_memory_bytes() // 16, 2 << 30))


class Settings(BaseSettings):
    """mmsync settings. Each field ``x`` is read from ``MMSYNC_X``."""

    model_config = SettingsConfigDict(env_prefix="MMSYNC_", frozen=True, extra="ignore")

    broker: str | None = Field(
        default=None,
        description="Kafka bootstrap URL, e.g. kafka://127.0.0.1:9092; unset: the embedded broker",
    )
    broker_embedded: bool = Field(
        default=False,
        description="the broker is the embedded Tansu one: apply its workarounds (set by mmsync)",
    )
    embedded_fetch_wait_ms: int = Field(
        default=20, ge=1, le=1500, description="embedded broker only: the consumers' longest"
        " fetch wait, ms; Tansu answers an empty fetch only after half of it, so new records"
        " wait up to half of it (docs/broker.md, fault 2); lower: sooner, more idle fetches"
        " (a worker and Tansu at idle: 0.21 cores at 20 ms, 0.12 at 100: scripts/bench_idle.py)")
    topic_prefix: str = Field(default="mm", description="prefix of every topic name")
    partitions: int = Field(default=8, ge=1, le=1024, description="partitions per topic")
    create_topics: bool = Field(
        default=True, description="at start, create missing topics (admin API) with"
        " MMSYNC_PARTITIONS partitions; false: only check that every topic exists with that"
        " count (clusters where mmsync may not create topics)")
    data_dir: Path = Field(default=Path(".mmsync"),
                           description="worker state: tables, cache, models")
    sync_hz: float = Field(default=20.0, gt=0, le=1000, description="rate of the aligned grid, Hz")
    window_ms: int = Field(default=1000, ge=50, le=600_000, description="event-time window, ms")
    lateness_ms: int = Field(default=200, ge=0,
                             description="allowed lateness behind the newest ts, ms")
    idle_ms: int = Field(
        default=2000, ge=10, description="wall-clock ms after which a silent modality stops holding"
        " the watermark back",
    )
    mark_interval_ms: int = Field(
        default=500, ge=20, le=10_000, description="how often each feature agent sends a"
        " progress mark (how far it got through its input) to the aligner, ms")
    max_hold_ms: int = Field(
        default=30_000, ge=0, description="longest a modality whose feature agent went silent"
        " (no progress marks) holds a stream's windows back, ms; one that keeps saying it is"
        " behind holds them until it catches up")
    restore_lookback_s: float = Field(
        default=120.0, ge=0, description="after a takeover the aligner reads mm.aligned and"
        " mm.late back this far before the first replayed record, s (what was emitted)")
    drill_image_load_s: float = Field(
        default=0.0, ge=0, le=600, description="fault drill only: the image models take this"
        " much longer to load, s; 0 outside drills and tests")
    drill_extract_s: float = Field(
        default=0.0, ge=0, le=600, description="fault drill only: each batch of frames takes"
        " this much longer in the image models, s; 0 outside drills and tests")
    max_skew_ms: int = Field(default=1000, ge=10, le=10_000,
                             description="largest skew of the audio (and lead of the captions)"
                             " the estimate searches, ms")
    max_text_skew_ms: int = Field(default=2500, ge=10, le=10_000,
                                  description="how far captions may trail the speech they"
                                  " belong to, ms (ASR captions come 0.5 to 2 s late)")
    skew_correction: bool = Field(
        default=True, description="estimate each stream's skew and correct for it")
    skew_segment_ms: int = Field(
        default=2000, ge=500, le=30_000,
        description="signal the skew estimate compares per update (every 0.5 s of media), ms")
    device: Literal["auto", "cpu", "cuda"] = Field(default="auto", description="inference device")
    gpu_mem_limit_mb: int = Field(default=0, ge=0, description="CUDA arena cap, MiB; 0: no cap")
    precision: Literal["auto", "fp32", "int8", "fp16"] = Field(
        default="auto", description="image model precision. auto: FP16 on CUDA; on a CPU INT8"
        " (static, built at first start into models_dir) where it measured >= 1.15x FP32, else"
        " FP32. fp16 on a CPU and int8 on CUDA fall back to FP32 and FP16",
    )
    models: Literal["full", "light"] = Field(
        default="full", description="full: the real models (embeddings, NSFW, VAD, mel, terms);"
        " light: only the cheap signals the aligner needs (luma, change, rms, tokens)",
    )
    models_dir: Path | None = Field(
        default=None, description="where exported and converted ONNX files live; unset:"
        " data_dir/models",
    )
    model_threads: int = Field(
        default=0, ge=0, le=64, description="intra-op threads per model session; 0: 1 on a box of"
        " up to 2 cores, else a third of the cores (at most 4)",
    )
    tensorrt: bool = Field(default=True, description="use TensorRT when its libraries load (engines"
                           " are built on first use of each batch shape, cached in models_dir)")
    ocr_every_n_frames: int = Field(
        default=0, ge=0, description="OCR one frame in N per stream (0.4-0.9 s per frame on a CPU);"
        " 0: off",
    )
    image_dedup: bool = Field(default=True, description="a near-duplicate frame reuses the"
                              " features of its stream's last computed frame")
    text_embedding: bool = Field(default=True, description="multilingual-e5-small sentence"
                                 " embedding of each text (about 20 ms per new sentence)")
    terms_files: str = Field(
        default="", description="comma list of extra sensitive-term files (one term a line, '#'"
        " comments), added to the shipped zh/en defaults",
    )
    # -- moderation alerts on PREFIX.alerts (issue 17; app/alerts/, docs/operations.md) --
    alerts: bool = Field(default=True, description="publish a moderation alert for every input"
                         " whose signal crosses its threshold, as soon as its features exist")
    alert_nsfw: float = Field(default=0.8, ge=0.0, le=1.0, description="alert on a frame whose"
                              " NSFW score is at least this (0..1)")
    alert_terms: bool = Field(default=True, description="alert on sensitive terms matched in a"
                              " caption (the shipped lists plus terms_files)")
    alert_ocr_terms: bool = Field(default=True, description="alert on sensitive terms in a"
                                  " frame's OCR text (only where OCR runs: ocr_every_n_frames)")
    # -- end of moderation alerts --
    cache: bool = Field(default=True, description="cache model features in RocksDB by content"
                        " (full models only: the light signals cost less than a look-up)")
    cache_max_bytes: int = Field(
        default_factory=default_cache_bytes, ge=0,
        description="feature cache byte budget (keys, headers, payloads); 0: 1/16 of RAM,"
                    " at most 2 GiB; never exceeded (margin 0 bytes)")
    image_ttl_s: int = Field(default=300, ge=0,
                             description="seconds an image feature stays cached; 0: never expires")
    text_ttl_s: int = Field(default=3600, ge=0,
                            description="seconds a text feature stays cached; 0: never expires")
    audio_ttl_s: int = Field(default=600, ge=0,
                             description="seconds an audio feature stays cached; 0: never expires")
    stream_ttl_s: float = Field(default=600.0, ge=1.0, description="a stream with no open"
                                " window and no record for this long is forgotten, s")
    degrade: bool = Field(default=True, description="sample the image models and drop OCR and"
                          " text embedding while records queue too long (app/features/degrade.py)")
    degrade_lag_ms: int = Field(default=1000, ge=10, description="queueing delay (or the"
                                " delay the records waiting behind a batch will reach) above"
                                " which the degradation level goes up (one step, or to the"
                                " level a longer delay calls for), ms")
    degrade_embed_lag_ms: int = Field(default=200, ge=0, description="a frame batch whose"
                                      " alerts would come later than this after their records"
                                      " (its oldest record's wait, or the wait of those behind"
                                      " it, plus its recent time to scores) runs Open-NSFW"
                                      " only, without the EfficientNet embedding, so frame"
                                      " alerts keep up with a burst, ms; 0: never (issue 26)")
    degrade_int8: bool = Field(default=True, description="at FP32 on a CPU with an INT8"
                               " instruction (the one auto would use), a frame batch whose"
                               " alerts would come late (degrade_embed_lag_ms) is scored by"
                               " the INT8 Open-NSFW, about 2.7x faster: every frame still"
                               " scored, its alert sooner, the score within INT8's error"
                               " (issue 26)")
    producer_linger_ms: int = Field(default=5, ge=0, le=1000, description="the workers'"
                                    " producer waits up to this long to put more records in"
                                    " one request, ms (Faust's producer_linger; 0: each send"
                                    " at once, a request per record under load: issue 26)")
    buffer_max: int = Field(default=256, ge=1, le=100_000, description="records buffered per"
                            " partition before the consumer pauses it (backpressure)")
    batch_max: int = Field(default=8, ge=1, le=1024, description="largest micro-batch per agent")
    batch_wait_ms: int = Field(default=10, ge=0, le=10_000, description="longest wait to fill one")
    web_host: str = Field(default="127.0.0.1", description="metrics web server bind address")
    web_port: int = Field(default=6066, ge=0, le=65535, description="metrics web server port")
    agents: str = Field(default="all", description="comma list of text,image,audio,aligner or all")
    max_text_bytes: int = Field(default=64 * 1024, description="contract limit on TextEvent.text")
    max_image_bytes: int = Field(default=8 * 1024 * 1024, description="contract limit on frames")
    max_audio_bytes: int = Field(default=4 * 1024 * 1024, description="largest PCM chunk, bytes")
    max_future_s: int = Field(
        default=7 * 24 * 3600, ge=0, description="how far past now a ts may lie, s (0: no check)"
    )
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        default="PLAINTEXT",
        description="Kafka security protocol of every client (workers, produce, tail)")
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = Field(
        default="PLAIN", description="SASL mechanism when security_protocol is SASL_*")
    sasl_username: str | None = Field(default=None, description="SASL user name")
    sasl_password: SecretStr | None = Field(default=None,
                                            description="SASL password (a secret: never logged)")
    ssl_cafile: Path | None = Field(default=None, description="PEM file of the CA that signed"
                                    " the brokers' certificates; unset: the system trust store")
    ssl_certfile: Path | None = Field(default=None, description="PEM client certificate for"
                                      " mutual TLS (with ssl_keyfile); unset: no client cert")
    ssl_keyfile: Path | None = Field(default=None, description="PEM private key of"
                                     " ssl_certfile; unset: the key is in the certificate file")
    ssl_key_password: SecretStr | None = Field(default=None, description="password of"
                                               " ssl_keyfile, if it is encrypted")
    ssl_check_hostname: bool = Field(default=True, description="check the broker's"
                                     " certificate names its host; off only for test clusters")
    log_level: str = Field(default="warning",
                           description="log level of the worker (debug, info, warning, error)")
    broker_wait_s: float = Field(
        default=30.0, gt=0, le=3600, description="how long a worker waits at start for the broker"
        " to answer before it exits with an error, s",
    )

    @field_validator("topic_prefix")
    @classmethod
    def _prefix_ok(cls, v: str) -> str:
        if not v or any(c not in "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-"
                        for c in v):
            raise ValueError("topic_prefix may hold only letters, digits, '.', '_' and '-'")
        return v

    @field_validator("terms_files")
    @classmethod
    def _terms_exist(cls, v: str) -> str:
        missing = [p.strip() for p in v.split(",") if p.strip() and not Path(p.strip()).is_file()]
        if missing:
            raise ValueError(f"terms_files not found: {missing}")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        if self.window_ms * self.sync_hz / 1000.0 < 1:
            raise ValueError("window_ms is shorter than one tick of sync_hz")
        return self

    @property
    def models_path(self) -> Path:
        """Directory of exported model files (``models_dir`` or ``data_dir/models``)."""
        return self.models_dir or self.data_dir / "models"

    @property
    def terms_paths(self) -> list[Path]:
        return [Path(p.strip()) for p in self.terms_files.split(",") if p.strip()]

    def topic(self, name: str) -> str:
        """Full name of a contract topic: ``text`` -> ``mm.text``."""
        return f"{self.topic_prefix}.{name}"

    @property
    def bootstrap(self) -> str:
        """host:port list for aiokafka (the ``kafka://`` scheme stripped)."""
        if not self.broker:
            raise ValueError("no broker set")
        return ",".join(u.split("://", 1)[-1] for u in self.broker.split(","))

    @property
    def enabled_agents(self) -> set[str]:
        names = {"text", "image", "audio", "aligner"}
        if self.agents.strip() == "all":
            return names
        chosen = {a.strip() for a in self.agents.split(",") if a.strip()}
        unknown = chosen - names
        if unknown:
            raise ValueError(f"unknown agents: {sorted(unknown)}")
        return chosen

    def ttl_s(self, modality: str) -> int:
        return {"image": self.image_ttl_s, "text": self.text_ttl_s, "audio": self.audio_ttl_s}[
            modality
        ]
