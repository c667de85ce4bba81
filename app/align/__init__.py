"""Event-time windows, watermarks, the sync grid and skew estimation (pure: no Faust)."""
