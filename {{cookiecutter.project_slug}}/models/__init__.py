"""One module per model. Each ends with ``model.register(name, ModelSpec(...))``; ``model.py`` imports them all.

Modules whose name starts with ``_`` are not imported (keep helpers or drafts there).
"""
