import os

# Keep jieba's cache and any model exports out of the user's home during tests.
os.environ.setdefault("JIEBA_CACHE", "/tmp/mmsync-jieba.cache")
# Exported ONNX models are shared by every test and worker of a run (the first
# export of EfficientNet-Lite0 takes about 4 s; loading it afterwards 0.1 s).
os.environ.setdefault("MMSYNC_MODELS_DIR", "/tmp/mmsync-models")
