"""Per-modality feature extractors (pure: no Faust, no Kafka)."""
