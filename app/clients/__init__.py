"""Programs around the workers: publishing media, reading outputs, the demo, moderation."""
