"""The PyTorch DataLoader collector: ``loader.py`` rebuilds the loader around timed wrappers;
``dataset.py`` times a dataset's transforms and loader (one stage per transform)."""
