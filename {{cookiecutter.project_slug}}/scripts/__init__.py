"""Command-line tools of the project, each run from the project folder as ``python -m scripts.NAME``."""
