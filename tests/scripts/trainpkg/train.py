"""Run as ``python -m trainpkg.train``: a relative import, and arguments after ``--``."""

import sys

from .data import make_loader

if __name__ == "__main__":
    print("args", sys.argv[1:])
    total = sum(float(b.sum()) for b in make_loader())
    print("total", total)
