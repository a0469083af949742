"""Shared helpers: configuration, audio processing and data loading."""
