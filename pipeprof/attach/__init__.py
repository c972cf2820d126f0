"""Profiling someone else's loop: what ``pipeprof run`` installs in an unmodified script
(``run.py``) and the pass router the framework callbacks share (``loops.py``). Both drive a
``pipeprof.Profiler`` through its public surface (docs/architecture.md)."""
