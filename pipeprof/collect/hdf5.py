"""h5py reads timed where they run, with bytes, chunks and the filter, and h5py handles a forked
worker would inherit. The user's code is not changed; h5py is imported only if the user did.

NOTE [ Timing h5py reads ]
A dataset opens its file where it likes: lazily in ``__getitem__`` inside each worker (the
pattern h5py recommends), in ``worker_init_fn``, or in ``__init__``. There is no object of the
user's to wrap before the reads happen, but every read passes through two public methods of a
public class, ``h5py.Dataset.__getitem__`` (slicing and fancy indexing; ``dset[i]`` looks
dunders up on the type, so a class attribute reaches it) and ``read_direct`` (also behind
``np.asarray(dset)``). pipeprof replaces those two on the class, with functions that call the
originals with the same arguments and return what they return: in a worker when it starts
(``WorkerInit``; the process is the profiled loader's own), and in the main process for as long
as a profiled pass runs (``install``/``uninstall``, counted, so nested profiles share one
patch: NOTE [ Counted class patches ] in collect/patch.py); when the last pass ends the
originals go back, unless someone replaced ours meanwhile.
While the recorder is off a read pays one attribute read more. Wrapping the user's h5py objects
instead would need them to exist before the workers start (in the lazy pattern they do not),
would change ``type(dset)``, and would miss handles opened later.

Each read is the relative stage ``read`` (``load/read`` inside ``__getitem__``). Inside a stage
already named ``read`` (the user's own ``pipeprof.stage("read")``) it is only counted: that
stage times it. Counting runs after the read, outside its time; its cost is pipeprof's own, so
it is detached from the enclosing stages (added to the thread's ``detached``, NOTE [ Stage paths
and self time ] in core/recorder.py) and summed in ``cost_ns``.

What is counted, per dataset (``"file:/name"``) in the sink's aggregates (``counts(sink)["h5"]``,
bounded by the datasets read, never by the reads): reads, their ns, bytes returned; for a chunked
dataset whose selection is understood (ints, slices with a positive step, ``...``, one 1-D list
or array of indices or booleans per dimension, field names): the chunks touched (per dimension,
the distinct chunk indices the selection hits, multiplied: h5py selections are orthogonal), the
bytes those chunks decode to (chunks × the chunk's bytes: HDF5 allocates whole chunks, edge
chunks too) and the bytes stored for them (``get_chunk_info_by_coord`` for up to
``EXACT_CHUNKS`` chunks a read, remembered per dataset; beyond, the dataset's mean stored chunk,
``get_storage_size() / get_num_chunks()``, counted in ``stored_estimated``), and the selection's
extent per dimension (``extent_sum``: the mean read shape). Any other selection counts its read
(``unparsed``) with no bytes or chunk figures, rather than a guess.
"""

from __future__ import annotations

import itertools
import sys
import types
import weakref
from typing import Any

from pipeprof.collect.patch import ClassPatch
from pipeprof.core.recorder import clock, counts, recorder

EXACT_CHUNKS = 8  # chunks a read may touch and still have each one's stored size looked up
_MEMO_LIMIT = 4096  # stored chunk sizes remembered per dataset
_CACHE_LIMIT = 256  # datasets whose layout is remembered per process
_rec = recorder()

# h5z filter ids as HDF5 defines them (H5Zpublic.h) and lzf's registered id
_FILTERS = {1: "gzip", 2: "shuffle", 3: "fletcher32", 4: "szip", 5: "nbit", 6: "scaleoffset",
            32000: "lzf"}  # fmt: skip


def _h5_dataset() -> Any:
    h5py = sys.modules.get("h5py")
    return None if h5py is None else h5py.Dataset


def _getitem(self: Any, args: Any, new_dtype: Any = None) -> Any:
    if not _rec.enabled:
        return _ORIG["__getitem__"](self, args, new_dtype)
    return _timed(self, args, new_dtype, None)


def _read_direct(self: Any, dest: Any, source_sel: Any = None, dest_sel: Any = None) -> None:
    if not _rec.enabled:
        return _ORIG["read_direct"](self, dest, source_sel, dest_sel)  # type: ignore[no-any-return]
    _timed(self, source_sel, dest_sel, dest)
    return None


def _timed(dset: Any, sel: Any, extra: Any, dest: Any) -> Any:
    """One read, timed and counted: ``dset[sel]`` (``dest`` None; ``extra`` is ``new_dtype``) or
    ``dset.read_direct(dest, sel, extra)``."""
    rec = _rec
    inside = rec.innermost
    frame = None
    if inside is None or not (inside == "read" or inside.endswith("/read")):
        frame = rec.open(rec.child_path("read"))
    t0 = clock()
    try:
        if dest is None:
            out = _ORIG["__getitem__"](dset, sel, extra)
        else:
            out = _ORIG["read_direct"](dset, dest, sel, extra)
    finally:
        ns = rec.close(frame) if frame is not None else clock() - t0
    c0 = clock()
    try:
        entry = _count(dset, () if sel is None and dest is not None else sel, out, dest, ns)
    except Exception:  # counting must never break a read; a dataset it cannot read is skipped
        entry = None
    cost = clock() - c0
    st = rec._local.st
    if st.path is not None:  # pipeprof's own time: out of every enclosing stage
        st.detached += cost
    if entry is not None:
        entry["cost_ns"] += cost
    return out


class _Info:
    """What one open dataset is, read once (h5py attribute reads cost microseconds each)."""

    __slots__ = ("chunk_bytes", "chunks", "itemsize", "key", "layout", "mean_stored", "memo",
                 "ref", "shape")  # fmt: skip

    def __init__(self, dset: Any) -> None:
        dsid = dset.id
        self.ref = weakref.ref(dsid)
        self.shape: tuple[int, ...] = tuple(dset.shape or ())
        self.chunks: tuple[int, ...] | None = dset.chunks
        self.itemsize = int(dset.dtype.itemsize)
        dcpl = dsid.get_create_plist()
        filters = []
        for i in range(dcpl.get_nfilters()):
            code, _flags, _values, name = dcpl.get_filter(i)
            raw = name.decode(errors="replace") if isinstance(name, bytes) else str(name)
            filters.append(_FILTERS.get(code) or raw or f"filter {code}")
        try:
            cache_bytes: int | None = int(dsid.get_access_plist().get_chunk_cache()[1])
        except Exception:
            cache_bytes = None
        n = 1
        for c in self.chunks or ():
            n *= c
        self.chunk_bytes = n * self.itemsize if self.chunks else None
        variable = dset.dtype.kind == "O"  # strings, references: bytes returned mean nothing
        if variable:
            self.chunks = None
        kind = "chunked" if self.chunks else ("variable-length" if variable else _kind(dcpl))
        self.layout = {
            "file": str(dset.file.filename),
            "name": str(dset.name),
            "shape": list(self.shape),
            "dtype": str(dset.dtype),
            "kind": kind,
            "chunks": list(self.chunks) if self.chunks else None,
            "chunk_bytes": self.chunk_bytes,
            "filter": "+".join(filters) or "none",
            "cache_bytes": cache_bytes,
        }
        self.key = f"{self.layout['file']}:{self.layout['name']}"
        self.mean_stored: float | None = None
        self.memo: dict[tuple[Any, ...], int] = {}  # chunk index -> bytes stored


def _kind(dcpl: Any) -> str:
    import h5py

    layout = dcpl.get_layout()
    names = {h5py.h5d.CONTIGUOUS: "contiguous", h5py.h5d.COMPACT: "compact"}
    if hasattr(h5py.h5d, "VIRTUAL"):
        names[h5py.h5d.VIRTUAL] = "virtual"
    return names.get(layout, "not chunked")


_infos: dict[int, _Info] = {}


def _info(dset: Any) -> _Info:
    """The dataset's ``_Info``, remembered by the hash of its id: h5py hashes an object id by
    its file's serial number and its address in it, so a dataset opened again (``f["x"][i]``
    makes a new id every read) finds its ``_Info`` at the cost of a hash (about 0.6 µs)."""
    dsid = dset.id
    key = hash(dsid)
    info = _infos.get(key)
    if info is not None:
        held = info.ref()
        if held is None or held is dsid or held == dsid:
            if held is None:
                info.ref = weakref.ref(dsid)
            return info
    if len(_infos) >= _CACHE_LIMIT:
        _infos.clear()
    info = _infos[key] = _Info(dset)
    return info


def _count(dset: Any, sel: Any, out: Any, dest: Any, ns: int) -> dict[str, Any]:
    """Count one read of ``dset`` into this thread's sink; returns the dataset's entry."""
    info = _info(dset)
    mine = counts(_rec.sink)
    found = mine.get("h5")
    if found is None:
        found = mine["h5"] = {}
    entry = found.get(info.key)
    if entry is None:
        entry = found[info.key] = _entry(info)
    entry["reads"] += 1
    entry["read_ns"] += ns
    dims = _dims(sel, info.shape)
    if dims is None:
        entry["unparsed"] += 1
        return entry
    elements = 1
    extent = entry["extent_sum"]
    for k, d in enumerate(dims):
        n = len(d)
        elements *= n
        extent[k] += n
    returned = elements * info.itemsize if dest is not None else int(getattr(out, "nbytes", 0))
    entry["returned_bytes"] += returned
    chunks = info.chunks
    if chunks is None or not elements:
        return entry
    ids = [_chunk_ids(d, c) for d, c in zip(dims, chunks)]
    touched = 1
    for i in ids:
        touched *= len(i)
    entry["chunked_reads"] += 1
    entry["chunked_returned_bytes"] += returned
    entry["chunks"] += touched
    entry["decoded_bytes"] += touched * (info.chunk_bytes or 0)
    entry["stored_bytes"] += _stored(dset, info, ids, touched)
    if touched > EXACT_CHUNKS:
        entry["stored_estimated"] += touched
    return entry


def _entry(info: _Info) -> dict[str, Any]:
    return {
        "layout": info.layout,
        "reads": 0, "read_ns": 0, "returned_bytes": 0, "unparsed": 0, "cost_ns": 0,
        "chunked_reads": 0, "chunked_returned_bytes": 0, "chunks": 0, "decoded_bytes": 0,
        "stored_bytes": 0, "stored_estimated": 0,
        "extent_sum": [0] * len(info.shape),
    }  # fmt: skip


def _dims(sel: Any, shape: tuple[int, ...]) -> list[Any] | None:
    """Per dimension of ``shape``, the indices ``sel`` reads: a ``range`` or a 1-D int array;
    None for a selection this does not follow (NOTE [ Timing h5py reads ])."""
    args = sel if type(sel) is tuple else (sel,)
    n = len(shape)
    out: list[Any] = []
    for k, a in enumerate(args):  # the usual reads: ints and slices, nothing else
        t = type(a)
        if k >= n:
            return _dims_any(args, shape)
        if t is int:
            i = a + shape[k] if a < 0 else a
            if not 0 <= i < shape[k]:
                return None
            out.append(range(i, i + 1))
        elif t is slice:
            r = range(*a.indices(shape[k]))
            if r.step <= 0:
                return None
            out.append(r)
        else:
            return _dims_any(args, shape)
    for k in range(len(out), n):
        out.append(range(shape[k]))
    return out


def _dims_any(args: tuple[Any, ...], shape: tuple[int, ...]) -> list[Any] | None:
    """``_dims`` for any selection: ``...``, field names, NumPy ints, index lists and masks."""
    import numpy as np

    args = tuple(a for a in args if not isinstance(a, (str, bytes)))  # field names
    n = len(shape)
    if any(a is Ellipsis for a in args):
        i = next(k for k, a in enumerate(args) if a is Ellipsis)
        args = args[:i] + (slice(None),) * (n - len(args) + 1) + args[i + 1 :]
    if len(args) > n or any(a is Ellipsis for a in args):
        return None
    args += (slice(None),) * (n - len(args))
    out: list[Any] = []
    for a, dim in zip(args, shape):
        if isinstance(a, slice):
            r = range(*a.indices(dim))
            if r.step <= 0:
                return None
            out.append(r)
        elif isinstance(a, (int, np.integer)) and not isinstance(a, (bool, np.bool_)):
            i = int(a) + (dim if a < 0 else 0)
            if not 0 <= i < dim:
                return None
            out.append(range(i, i + 1))
        elif isinstance(a, (list, np.ndarray)):
            arr = np.asarray(a)
            if arr.ndim != 1:
                return None
            if arr.dtype == np.bool_ and arr.size == dim:
                arr = np.flatnonzero(arr)
            elif arr.dtype.kind in "iu":
                arr = np.where(arr < 0, arr + dim, arr)
            elif arr.size:
                return None
            out.append(arr)
        else:
            return None
    return out


def _chunk_ids(indices: Any, c: int) -> Any:
    """The distinct chunk indices (chunk size ``c``) that ``indices`` falls in."""
    if type(indices) is not range:
        import numpy as np

        return np.unique(np.asarray(indices) // c)
    if not indices:
        return range(0)
    if indices.step <= c:  # less than a chunk apart: every chunk in the span is hit
        return range(indices[0] // c, indices[-1] // c + 1)
    return _Strided(indices, c)  # a chunk or more apart: each index its own chunk


class _Strided:
    """The chunk indices of a range whose step is at least a chunk: one per index."""

    def __init__(self, indices: range, c: int) -> None:
        self.indices, self.c = indices, c

    def __len__(self) -> int:
        return len(self.indices)

    def __iter__(self) -> Any:
        return (i // self.c for i in self.indices)


def _stored(dset: Any, info: _Info, ids: list[Any], touched: int) -> int:
    """Bytes stored for the chunks ``ids`` spans (NOTE [ Timing h5py reads ])."""
    if touched > EXACT_CHUNKS:
        if info.mean_stored is None:
            n = dset.id.get_num_chunks()
            info.mean_stored = dset.id.get_storage_size() / n if n else 0.0
        return round(info.mean_stored * touched)
    chunks = info.chunks or ()
    memo = info.memo
    if touched == 1:  # the usual read: one chunk
        coord: tuple[Any, ...] = tuple(next(iter(i)) for i in ids)
        size = memo.get(coord)
        if size is not None:
            return size
    total = 0
    for coord in itertools.product(*ids):
        size = memo.get(coord)
        if size is None:
            offset = tuple(int(i) * c for i, c in zip(coord, chunks))
            size = int(dset.id.get_chunk_info_by_coord(offset).size)  # 0: never written
            if len(memo) < _MEMO_LIMIT:
                memo[coord] = size
        total += size
    return total


def inherited_handles(dataset: Any, limit: int = 2000) -> list[dict[str, str]]:
    """Open h5py objects (files, groups, datasets) reachable from ``dataset``'s attributes: what
    forked workers would inherit (the fork hazard, docs/hdf5.md). Walks attributes, lists,
    tuples and dicts, at most ``limit`` objects and 6 levels deep; nothing when h5py is not
    imported. Each: ``where`` (``dataset.f``), ``kind``, ``file``, ``name``."""
    h5py = sys.modules.get("h5py")
    if h5py is None:
        return []
    kinds = (h5py.File, h5py.Group, h5py.Dataset)
    found: list[dict[str, str]] = []
    seen: set[int] = set()
    todo: list[tuple[Any, str, int]] = [(dataset, "dataset", 0)]
    while todo and len(seen) < limit:
        obj, where, depth = todo.pop(0)
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, kinds):
            if _open(obj):
                kind = "File" if isinstance(obj, h5py.File) else type(obj).__name__
                found.append({"where": where, "kind": kind, "file": _filename(obj),
                              "name": str(obj.name)})  # fmt: skip
            continue
        if depth >= 6:
            continue
        for label, child in _children(obj):
            todo.append((child, f"{where}{label}", depth + 1))
    return found


def _open(obj: Any) -> bool:
    try:
        return bool(obj.id.valid)
    except Exception:
        return False


def _filename(obj: Any) -> str:
    try:
        return str(obj.file.filename)
    except Exception:
        return "?"


_LEAVES = (str, bytes, int, float, complex, bool, type(None), type, types.ModuleType,
           types.FunctionType, types.MethodType, types.BuiltinFunctionType)  # fmt: skip
_ARRAYS = ("ndarray", "Tensor", "Parameter", "DataFrame", "Series")


def _children(obj: Any) -> list[tuple[str, Any]]:
    """What an object holds, for the walk: a container's items (first 100), else its
    attributes; nothing for numbers, strings, arrays, tensors, modules and functions."""
    if isinstance(obj, _LEAVES) or type(obj).__name__ in _ARRAYS:
        return []
    if isinstance(obj, dict):
        return [(f"[{k!r}]", v) for k, v in itertools.islice(obj.items(), 100)]
    if isinstance(obj, (list, tuple, set)):
        return [(f"[{i}]", v) for i, v in enumerate(itertools.islice(obj, 100))]
    attrs = getattr(obj, "__dict__", None)
    if not isinstance(attrs, dict):
        return []
    return [(f".{k}", v) for k, v in attrs.items()]


# h5py's reads timed in this process while installed (NOTE [ Timing h5py reads ]; install is
# False while h5py is not imported): NOTE [ Counted class patches ] in collect/patch.py. The
# originals, which ours call, in _ORIG.
PATCH = ClassPatch(
    [(_h5_dataset, "__getitem__", _getitem), (_h5_dataset, "read_direct", _read_direct)]
)
install, uninstall, installed = PATCH.install, PATCH.uninstall, PATCH.installed
_ORIG = PATCH.orig
