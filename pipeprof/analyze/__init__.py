"""Analysis: pure functions from a Session to the report dictionary, and over report dicts.

``analyze(session)`` (analysis.py) builds the report: stage tables (stages.py), the loop's
attribution (loop.py), the verdict (verdict.py), findings (rules.py for torch, tf_rules.py for
tf.data, over the shared facts of finding.py), what-if estimates (scenarios.py over the model of
whatif.py). compare.py compares two report dicts. Nothing here imports a collector or renderer.
"""

from pipeprof.analyze.analysis import SCHEMA, analyze

__all__ = ["SCHEMA", "analyze"]
