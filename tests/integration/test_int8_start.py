"""A real worker started with MMSYNC_DEVICE=auto on a machine where CUDA cannot run:
no ONNX Runtime error lines in its log, one line per model saying the provider and
precision, and the same in mmsync_model_info."""

from __future__ import annotations

import time

import onnxruntime as ort
import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.features.cudalibs import cuda_problem
from app.kafka.topics import ensure_topics

pytestmark = pytest.mark.integration

_ORT_ERRORS = ("[E:onnxruntime", "EP Error", "Failed to load library",
               "Failed to create CUDAExecutionProvider")


async def test_cpu_only_worker_start_is_clean_and_says_what_runs(pipeline):
    if "CUDAExecutionProvider" not in ort.get_available_providers() or cuda_problem() is None:
        pytest.skip("needs onnxruntime-gpu on a machine where CUDA cannot run")
    await ensure_topics(pipeline.settings)
    worker = pipeline.start_worker(MMSYNC_DEVICE="auto", MMSYNC_LOG_LEVEL="info",
                                   MMSYNC_AGENTS="image")
    deadline = time.monotonic() + 240  # a first start builds the INT8 models (about 40 s)
    info: dict[str, tuple[str, str]] = {}
    while len(info) < 2 and time.monotonic() < deadline:
        for fam in text_string_to_metric_families(pipeline.metrics(worker, timeout_s=60)):
            for smp in fam.samples:
                if smp.name == "mmsync_model_info" and smp.value == 1:
                    info[smp.labels["model"]] = (smp.labels["provider"], smp.labels["precision"])
        time.sleep(1)
    log = (pipeline.tmp / "worker0.log").read_text(errors="replace")
    assert set(info) == {"efficientnet_lite0", "open_nsfw"}, log
    assert all(p == "CPUExecutionProvider" and q in ("int8", "fp32") for p, q in info.values())
    assert not [ln for ln in log.splitlines() if any(e in ln for e in _ORT_ERRORS)], log
    assert "models run on the CPU: CUDA" in log
    for model, (provider, precision) in info.items():
        assert f"{model}: {provider}, {precision}" in log
