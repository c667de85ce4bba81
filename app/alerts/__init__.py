"""Moderation alerts: detection (pure) and their publication by the feature agents."""
