"""Thin Faust agents: decode, call a pure function, send."""

from __future__ import annotations

from app.runtime.faust_app import Runtime

__all__ = ["register_all"]


def register_all(rt: Runtime) -> None:
    """Register the agents chosen by ``settings.agents`` on the runtime's app."""
    from agents.aligner import register as register_aligner
    from agents.features import register as register_features

    enabled = rt.settings.enabled_agents
    for modality in ("text", "image", "audio"):
        if modality in enabled:
            register_features(rt, modality)
    if "aligner" in enabled:
        register_aligner(rt)
