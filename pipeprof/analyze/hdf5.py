"""h5py reads in the report, and the two HDF5 findings: read amplification and the fork hazard.

The figures come from ``Session.h5`` (what collect/hdf5.py counted in every process, summed per
dataset) and ``meta["h5_inherited"]`` (open h5py handles in the dataset when the workers
forked). See docs/hdf5.md for what each figure means and when it is n/a.
"""

from __future__ import annotations

import math
from typing import Any

from pipeprof.analyze.finding import Finding, Severity, finding
from pipeprof.core.session import Session

AMPLIFICATION = 4.0  # bytes decoded per byte returned above which a layout is called out


def h5_section(session: Session) -> list[dict[str, Any]]:
    """One row per h5py dataset read during the profile, most read time first. Ratios are
    None (n/a) where they cannot be known: a dataset that is not chunked, a selection pipeprof
    does not follow (``unparsed``), no bytes returned."""
    rows = [_row(entry) for entry in session.h5.values() if isinstance(entry, dict)]
    return sorted(rows, key=lambda r: -r["read_s"])


def _row(e: dict[str, Any]) -> dict[str, Any]:
    lay = e.get("layout") or {}
    reads, chunked = int(e.get("reads") or 0), int(e.get("chunked_reads") or 0)
    parsed = reads - int(e.get("unparsed") or 0)
    back = int(e.get("chunked_returned_bytes") or 0)
    extent = e.get("extent_sum") or []
    shape = [max(1, round(x / parsed)) for x in extent] if parsed else None
    if lay.get("kind") != "chunked":
        note = f"not chunked ({lay.get('kind') or 'unknown layout'}): no chunk figures"
    elif not chunked:
        note = "no read whose selection pipeprof follows: no chunk figures"
    else:
        note = None
    return {
        "file": lay.get("file"),
        "dataset": lay.get("name"),
        "kind": lay.get("kind"),
        "dtype": lay.get("dtype"),
        "shape": lay.get("shape"),
        "chunks": lay.get("chunks"),
        "chunk_bytes": lay.get("chunk_bytes"),
        "filter": lay.get("filter"),
        "cache_bytes": lay.get("cache_bytes"),
        "reads": reads,
        "read_s": round((e.get("read_ns") or 0) / 1e9, 9),
        "read_ms_mean": round((e.get("read_ns") or 0) / reads / 1e6, 6) if reads else None,
        "returned_bytes": int(e.get("returned_bytes") or 0),
        "read_shape": shape,  # the mean extent of a read per dimension
        "chunks_per_read": round(e["chunks"] / chunked, 4) if chunked else None,
        "decoded_amplification": round(e["decoded_bytes"] / back, 4) if chunked and back else None,
        "stored_amplification": round(e["stored_bytes"] / back, 4) if chunked and back else None,
        "stored_estimated_fraction": round(e["stored_estimated"] / e["chunks"], 4)
        if chunked and e.get("chunks")
        else None,
        **_cold_warm(e, reads),
        "unparsed_reads": int(e.get("unparsed") or 0),
        "cost_us_per_read": round((e.get("cost_ns") or 0) / reads / 1e3, 3) if reads else None,
        "note": note,
    }


def _cold_warm(e: dict[str, Any], reads: int) -> dict[str, Any]:
    """The first epoch's reads against later epochs' (loop mode, several epochs), ms per read
    each: a first epoch much slower than the later ones read from storage what later epochs
    found in a cache (the OS page cache, HDF5's chunk cache). None where not seen."""
    later = e.get("later") or {}
    n_later = int(later.get("reads") or 0)
    n_first = reads - n_later
    if not n_later or n_first <= 0:
        return {"first_epoch_read_ms": None, "later_read_ms": None}
    first_ms = ((e.get("read_ns") or 0) - (later.get("read_ns") or 0)) / n_first / 1e6
    return {
        "first_epoch_read_ms": round(first_ms, 6),
        "later_read_ms": round((later.get("read_ns") or 0) / n_later / 1e6, 6),
    }


def rule_read_amplification(report: dict[str, Any], facts: dict[str, Any]) -> Finding | None:
    """The dataset whose reads decode the most bytes per byte they return, when that is at
    least ``AMPLIFICATION``: its chunk layout against its access pattern, and the fixes."""
    rows = [r for r in report.get("hdf5") or [] if _amplified(r)]
    if not rows:
        return None
    r = max(rows, key=lambda r: r["read_s"])
    amp, per_read = r["decoded_amplification"], r["chunks_per_read"]
    chunk, shape = tuple(r["chunks"]), tuple(r["read_shape"])
    filtered = r["filter"] not in (None, "none")
    cache = r["cache_bytes"]
    needed = r["chunk_bytes"] * per_read
    back = r["chunk_bytes"] * per_read / amp  # bytes a read returns, on average
    certain = filtered and cache is not None and needed > cache
    if certain:
        cause = (
            f"the {_size(needed)} of chunks a read touches do not fit the {_size(cache)} chunk "
            "cache (rdcc_nbytes), so every read decompresses them again"
        )
    else:
        cause = (
            "reads that follow each other inside a chunk reuse it from the chunk cache; "
            f"random access decodes it again, so {amp:.3g}× is the most it costs"
        )
    message = (
        f"reads of {r['dataset']} ({_base(r['file'])}) return {_size(back)} "
        f"({_shape(shape)}) but touch {per_read:.3g} chunk{'s' if per_read != 1 else ''} of "
        f"{_size(r['chunk_bytes'])} ({_shape(chunk)}, {r['filter']}): {amp:.3g}× the bytes "
        f"decoded per byte returned; {cause}"
    )
    fixes = [
        f"rechunk to the shape of a read, chunks={shape} ({_size(back)} a chunk): "
        f"h5repack -l {r['dataset'].lstrip('/')}:CHUNK={'x'.join(map(str, shape))} IN.h5 OUT.h5, "
        f"or create_dataset(..., chunks={shape})",
        "or read whole chunks: one read of contiguous samples per batch (__getitems__) "
        f"returns {_shape(chunk)} at once",
    ]
    mib = math.ceil(max(needed * 2, 2**20) / 2**20)
    if filtered and (cache is None or mib * 2**20 > cache):  # a larger cache than it has only
        fixes.append(
            f"or, where consecutive reads share chunks, h5py.File(path, 'r', "
            f"rdcc_nbytes={mib} * 2**20) keeps them decoded"
        )
    if filtered and ("gzip" in r["filter"] or "szip" in r["filter"]):
        fixes.append("a lighter filter (compression='lzf', or none) decodes faster")
    fixes.append(  # the rate after it: measured on a rewritten sample (docs/hdf5.md says why)
        "the rate with each layout, before rewriting the file: pipeprof bench TARGET "
        "--encodings (a sample of the reads rewritten with 1 and 16 samples per chunk, "
        "uncompressed, gzip and lzf, timed and anchored to a real run)"
    )
    evidence = {
        "file": r["file"],
        "dataset": r["dataset"],
        "decoded_amplification": amp,
        "stored_amplification": r["stored_amplification"],
        "chunks_per_read": per_read,
        "chunks": list(chunk),
        "read_shape": list(shape),
        "chunk_bytes": r["chunk_bytes"],
        "cache_bytes": cache,
        "filter": r["filter"],
        "reads": r["reads"],
        "read_ms_mean": r["read_ms_mean"],
        "every_read_decodes": certain,
        "datasets_amplified": len(rows),
    }
    sev: Severity = "warning" if certain else "info"
    return finding("h5-read-amplification", sev, "load/read", message, evidence, "; ".join(fixes))


def _amplified(r: dict[str, Any]) -> bool:
    """Amplified, and the amplification is real: a filtered chunk is decoded whole; an
    unfiltered chunk larger than the cache is read only where selected (docs/validation/hdf5.md)."""
    amp = r.get("decoded_amplification")
    if amp is None or amp < AMPLIFICATION or not r.get("chunk_bytes"):
        return False
    filtered = r.get("filter") not in (None, "none")
    cache = r.get("cache_bytes")
    return filtered or (cache is not None and r["chunk_bytes"] <= cache)


def rule_fork_hazard(report: dict[str, Any], facts: dict[str, Any]) -> Finding | None:
    """Open h5py handles in the dataset when its workers forked (collect/hdf5.py)."""
    meta = report.get("meta") or {}
    handles = [h for h in meta.get("h5_inherited") or [] if isinstance(h, dict)]
    if not handles or not meta.get("num_workers"):
        return None
    first = handles[0]
    more = f" and {len(handles) - 1} more" if len(handles) > 1 else ""
    n = meta["num_workers"]
    return finding(
        "h5-fork-hazard",
        "warning",
        "load/read",
        f"the dataset holds an open h5py {first['kind']} ({first['where']}, "
        f"{_base(first['file'])}){more} when its {n} worker{'s' if n != 1 else ''} fork: "
        "each inherits the parent's HDF5 state, which is not fork-safe (wrong data, crashes, "
        "hangs)",
        {"handles": handles, "num_workers": n, "start_method": meta.get("multiprocessing_context")},
        "open the file in each worker instead: lazily in __getitem__ (if self.f is None: "
        "self.f = h5py.File(self.path, 'r')), or in worker_init_fn through "
        "torch.utils.data.get_worker_info().dataset; keep only the path in the parent "
        f"(close {first['where']} and set it to None before iterating)",
    )


def _size(n: float) -> str:
    for unit, k in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= k:
            return f"{n / k:.3g} {unit}"
    return f"{n:.0f} B"


def _shape(shape: tuple[int, ...]) -> str:
    return " × ".join(map(str, shape))


def _base(path: Any) -> str:
    return str(path or "?").rsplit("/", 1)[-1]


H5_RULES = [rule_fork_hazard, rule_read_amplification]
