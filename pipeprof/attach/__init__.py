"""Profiling someone else's loop: what ``pipeprof run`` installs in an unmodified script
(``run.py``, the framework patches in ``patches.py``, its files and the job report in
``outputs.py``) and the pass router the framework callbacks share (``loops.py``). All drive a
``pipeprof.Profiler`` through its public surface (docs/architecture.md)."""
