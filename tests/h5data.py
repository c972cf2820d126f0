"""Picklable h5py-backed datasets for tests/test_hdf5.py (spawn workers import them from here).

Kept out of pipelines.py so that the other tests' processes never import h5py.
"""

from __future__ import annotations

import h5py
import numpy as np
import torch
from torch.utils.data import Dataset


def write(path, name: str, data, **kwargs) -> None:
    """``data`` written as dataset ``name`` of a new file at ``path`` (``kwargs``: chunks,
    compression... as ``create_dataset`` takes them)."""
    with h5py.File(path, "a") as f:
        f.create_dataset(name, data=data, **kwargs)


def field(t: int, lat: int = 32, lon: int = 32, seed: int = 0):
    """A climate-style time × lat × lon float32 field."""
    return np.random.default_rng(seed).standard_normal((t, lat, lon)).astype("f4")


class LazyH5(Dataset):
    """The recommended pattern: the file is opened on first use, in the process that reads.
    ``how``: ``item`` reads ``d[i]``, ``fancy`` ``d[[i, i + step]]``, ``direct`` read_direct,
    ``block`` ``d[i:i + step]``, ``reopen`` ``f[name][i]`` (a new Dataset object each read).
    ``rdcc_nbytes``: the chunk cache the file is opened with (None: HDF5's default, 1 MiB before
    HDF5 2.0, 8 MiB from it)."""

    def __init__(self, path, name: str = "x", how: str = "item", step: int = 3, n=None,
                 rdcc_nbytes=None):  # fmt: skip
        self.path, self.name, self.how, self.step = str(path), name, how, step
        self.options = {} if rdcc_nbytes is None else {"rdcc_nbytes": rdcc_nbytes}
        self.f = None
        with h5py.File(self.path, "r") as f:
            self.shape = f[name].shape
        self.n = n or self.shape[0] - (step if how in ("fancy", "block") else 0)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if self.f is None:
            self.f = h5py.File(self.path, "r", **self.options)
        d = self.f[self.name]
        if self.how == "fancy":
            x = d[[i, i + self.step]]
        elif self.how == "direct":
            x = np.empty(self.shape[1:], "f4")
            d.read_direct(x, np.s_[i])
        elif self.how == "block":
            x = d[i : i + self.step]
        else:
            x = d[i]
        return torch.from_numpy(np.ascontiguousarray(x))


class EagerH5(Dataset):
    """The hazard: the file is opened in ``__init__``, in the parent, and forked workers inherit
    it."""

    def __init__(self, path, name: str = "x") -> None:
        self.f = h5py.File(str(path), "r")
        self.d = self.f[name]

    def __len__(self) -> int:
        return self.d.shape[0]

    def __getitem__(self, i: int):
        return torch.from_numpy(self.d[i])


class Holder:
    """Holds a dataset's handles one level down (``dataset.store.handles['x']``)."""

    def __init__(self, f) -> None:
        self.handles = {"x": f}


class NestedH5(LazyH5):
    """A lazy dataset that also keeps an open file deeper in its attributes."""

    def __init__(self, path, name: str = "x") -> None:
        super().__init__(path, name)
        self.store = Holder(h5py.File(str(path), "r"))
