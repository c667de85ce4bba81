import os

# Keep jieba's cache and any model exports out of the user's home during tests.
os.environ.setdefault("JIEBA_CACHE", "/tmp/mmsync-jieba.cache")
