"""The tf.data collector: ``graph.py`` reads a dataset's op graph into stage names, ``capture.py``
runs TensorFlow's profiler and ``trace.py`` parses its XSpace into stage times, ``dataset.py``
iterates a dataset and fills the Session, ``prefix.py`` times it prefix by prefix."""
