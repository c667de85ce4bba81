FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY app app
COPY agents agents
COPY schemas schemas
RUN pip install --no-cache-dir torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu \
    && pip install --no-cache-dir .
ENV MMSYNC_DATA_DIR=/data
CMD ["mmsync", "worker"]
