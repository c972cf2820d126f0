"""``pipeprof.bench``: the second producer beside the collectors. It runs each stage of a
pipeline on its own (``isolation.py``) over fixed samples (``sources.py``), measures worker
scaling (``scaling.py``) and fits the what-if model of analyze/whatif.py (``bench.py``);
``tf.py`` does the same for tf.data, prefix by prefix. ``encodings.py`` writes the samples in
other storage encodings (``codecs.py``), found as they are stored now (``storage.py``), and
predicts the throughput with each."""
