"""Integrations with training frameworks and tools (docs/integrations.md).

Each module imports its framework when it is imported itself, never from ``import pipeprof``; a
missing framework raises an ``ImportError`` that names the extra to install.
"""
