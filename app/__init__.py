"""mmsync: real-time multimodal stream alignment on Kafka."""

__all__ = ["__version__"]
__version__ = "0.1.0"
