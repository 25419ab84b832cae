"""`deepnmt serve`: a self-hosted HTTP translation server with dynamic batching (docs/serving.md). The code is in
`engines` (being split into one module per job) and `libretranslate` (LibreTranslate's API)."""

from __future__ import annotations

from .engines import (Batcher, InputTooLong, Metrics, MetricFamilies, ProcessTranslator, ServeOptions, ServerState,
                      Service, Settings, Source, Translator, build_app, choose_engine, default_workers, load_translator,
                      plan_models, serve)

__all__ = ["Batcher", "InputTooLong", "MetricFamilies", "Metrics", "ProcessTranslator", "ServeOptions", "ServerState",
           "Service", "Settings", "Source", "Translator", "build_app", "choose_engine", "default_workers",
           "load_translator", "plan_models", "serve"]
