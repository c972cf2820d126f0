"""The network reads of a profile (NOTE [ Timing network reads ] in collect/fetch.py), a row per
host: requests, their latency, bytes and the rate a body came at."""

from __future__ import annotations

from typing import Any, TypedDict

from pipeprof.analyze.finding import Finding, finding
from pipeprof.analyze.scenarios import from_report
from pipeprof.analyze.whatif import cached, faster, throughput
from pipeprof.core.session import Session
from pipeprof.core.units import LATENCY_BOUNDS_MS


class FetchRow(TypedDict):
    """One host's requests over the profile, summed over every process."""

    host: str
    requests: int
    latency_ms_mean: float | None  # request sent to headers in
    latency_ms_p50: float | None  # the histogram bucket's upper bound: at most this
    latency_ms_p95: float | None
    reads: int
    bytes: int
    read_s: float  # the bodies' reading
    read_mb_s: float | None  # bytes over the time their reads took, one request at a time
    fetch_s: float  # requests' latency and body reads together
    cost_s: float  # pipeprof's own counting


def fetch_section(session: Session) -> list[FetchRow]:
    """A row per host, most time first."""
    rows = [_row(host, e) for host, e in session.fetch.items() if isinstance(e, dict)]
    return sorted(rows, key=lambda r: -r["fetch_s"])


def _row(host: str, e: dict[str, Any]) -> FetchRow:
    requests, reads = int(e.get("requests") or 0), int(e.get("reads") or 0)
    latency_ns, read_ns = int(e.get("latency_ns") or 0), int(e.get("read_ns") or 0)
    nbytes = int(e.get("bytes") or 0)
    hist = [int(x) for x in e.get("latency_hist") or []]
    return {
        "host": host,
        "requests": requests,
        "latency_ms_mean": round(latency_ns / requests / 1e6, 6) if requests else None,
        "latency_ms_p50": quantile_bound(hist, 0.5),
        "latency_ms_p95": quantile_bound(hist, 0.95),
        "reads": reads,
        "bytes": nbytes,
        "read_s": round(read_ns / 1e9, 9),
        "read_mb_s": round(nbytes / 1e6 / (read_ns / 1e9), 3) if read_ns and nbytes else None,
        "fetch_s": round((latency_ns + read_ns) / 1e9, 9),
        "cost_s": round(int(e.get("cost_ns") or 0) / 1e9, 9),
    }


def quantile_bound(hist: list[int], q: float) -> float | None:
    """The upper bound (ms) of the bucket that holds quantile ``q`` of a latency histogram; None
    where it is empty, or the quantile is past the last bound."""
    total = sum(hist)
    if not total:
        return None
    seen = 0
    for k, n in enumerate(hist):
        seen += n
        if seen >= q * total:
            return float(LATENCY_BOUNDS_MS[k]) if k < len(LATENCY_BOUNDS_MS) else None
    return None


def fetch_totals(rows: list[dict[str, Any]]) -> tuple[float, float, int]:
    """Over the fetch rows: the requests' wait for their first byte (s), the whole fetch (s)
    and the requests."""
    latency = sum((r.get("latency_ms_mean") or 0) * r["requests"] / 1e3 for r in rows)
    return latency, sum(r["fetch_s"] for r in rows), sum(r["requests"] for r in rows)


def timed_samples(report: dict[str, Any]) -> float:
    """The samples of the batches whose stages were timed, which the fetch rows count (NOTE
    [ Unprofiled batches ] in collect/torch/loader.py)."""
    samples, batches = report.get("samples") or 0, report.get("batches") or 0
    timed = (report.get("meta") or {}).get("timed_batches")
    return float(timed * samples / batches if timed and batches else samples)


# NOTE [ Objects that hold a batch ]
# A fetch that waits for each request's first byte (the latency, not the bodies, takes most of
# it) costs a sample the wait over the samples a request brings. ``per_request_rate`` is the
# what-if of fetching objects of ``k`` samples (a batch's, or a shard's): each fetch stage's
# time a sample is split into the requests' latency and their bodies' reading, as the fetch
# rows measured them (``latency_ms_mean`` x ``requests``, ``read_s``); the latency part is
# scaled by the requests a sample has now over ``1 / k``, the bodies' part kept (the same bytes
# at the same rate a request), and the stage's CPU scaled with its time (``faster``: its parent
# stage, ``load``, saves as much). The loader's rate at the workers there are follows from the
# worker-pool model (analyze/whatif.py). It assumes a request's wait does not grow with its
# body (a first byte: true of the local test server and of object stores, whose time to first
# byte is per request) and that no more requests are made than now for the same samples.
# In-flight: ``n`` requests in flight in each worker (a thread pool over a batch's samples) wait
# for their first bytes together, so a sample keeps ``1 / n`` of its requests' wait; the same
# scaling of the stage, the bodies' reading kept (the server answers requests in parallel).


def per_request_rate(report: dict[str, Any], facts: dict[str, Any], k: int
                     ) -> tuple[float, float] | None:  # fmt: skip
    """The loader's rate now and with objects of ``k`` samples a request (NOTE [ Objects that
    hold a batch ]), at the workers there are; None where the model or the rows are missing,
    or the requests already bring ``k`` samples or more each."""
    _, _, requests = fetch_totals(report.get("fetch") or [])
    samples = timed_samples(report)
    if not requests or not samples or k < 1 or requests / samples <= 1 / k:
        return None
    return _latency_shared(report, facts, (1 / k) / (requests / samples))


def in_flight_rate(report: dict[str, Any], facts: dict[str, Any], n: int
                   ) -> tuple[float, float] | None:  # fmt: skip
    """The loader's rate now and with ``n`` requests in flight in each worker (a thread pool
    over a batch's samples in ``__getitems__``): the requests' wait overlaps ``n`` at a time,
    the bodies' reading stays as measured (NOTE [ Objects that hold a batch ], in-flight)."""
    return _latency_shared(report, facts, 1 / n) if n > 1 else None


def _latency_shared(report: dict[str, Any], facts: dict[str, Any], keep: float
                    ) -> tuple[float, float] | None:  # fmt: skip
    """The loader's rate now and with ``keep`` of the requests' wait left to each sample."""
    stages = report.get("stages") or {}
    latency, total, requests = fetch_totals(report.get("fetch") or [])
    model = from_report(report, int(facts["cores"]))
    if model is None or not total or not requests:
        return None
    scale = latency / total * keep + (1 - latency / total)
    known = {st.path for st in model.stages}
    paths = [p for p in stages if p.endswith("/fetch") and p in known]
    if not paths or scale >= 1:
        return None
    n = facts["n_workers"]  # a child's saving comes off its parent too (``faster``)
    return throughput(model, n), throughput(faster(model, {p: 1 / scale for p in paths}), n)


# What the what-if list says of larger objects: the loader's rate at the workers there are with
# OBJECT_BATCHES batches' samples a request, where the requests' wait for their first byte takes
# LATENCY_BOUND of the fetch or more (the fix that says "fetch larger objects": rules.fetch_fix).
OBJECT_BATCHES = (1, 4, 16)
IN_FLIGHT = (2, 4, 8)  # requests in flight a worker, at most a batch's samples
LATENCY_BOUND = 0.5


def object_rows(report: dict[str, Any], facts: dict[str, Any]) -> list[dict[str, Any]]:
    """The ``what_if`` rows of kind ``objects``: the loader alone with objects of ``k`` samples
    a request (a batch's, 4 batches', 16 batches': shards of that size), and of kind
    ``in_flight``: with ``n`` requests in flight a worker (where each sample is a request now),
    at the workers there are (NOTE [ Objects that hold a batch ]); none where the fetch is not
    latency-bound."""
    latency, total, requests = fetch_totals(report.get("fetch") or [])
    samples, batches = timed_samples(report), report.get("batches") or 0
    if not total or not requests or latency < LATENCY_BOUND * total or not batches:
        return []
    size = max(1, round((report.get("samples") or 0) / batches))
    now = round(samples / requests, 3)
    out: list[dict[str, Any]] = []
    for k in sorted({size * m for m in OBJECT_BATCHES}):
        rates = per_request_rate(report, facts, k)
        if rates is not None:
            out.append({"kind": "objects", "samples_per_request": k,
                        "workers": int(facts["n_workers"]),
                        "samples_per_s": round(rates[1], 1),
                        "now_samples_per_s": round(rates[0], 1), "now_samples_per_request": now,
                        "basis": f"the requests' wait for their first byte ({latency / total:.0%} "
                        "of the fetch) shared by the samples a request brings, the bodies' "
                        "reading as measured"})  # fmt: skip
    for m in sorted({min(k, size) for k in IN_FLIGHT}):
        rates = in_flight_rate(report, facts, m)
        if rates is not None and now <= 1:
            out.append({"kind": "in_flight", "requests_in_flight": m,
                        "workers": int(facts["n_workers"]),
                        "samples_per_s": round(rates[1], 1),
                        "now_samples_per_s": round(rates[0], 1),
                        "basis": f"{m} requests a worker waiting for their first byte together "
                        f"({latency / total:.0%} of the fetch), the bodies' reading as "
                        "measured"})  # fmt: skip
    return out


# NOTE [ A cache for later epochs ]
# A loader that fetches its samples over the network fetches them again every epoch. Where a
# profile saw two full passes or more, and the fetch (every ``*/fetch`` stage) is CACHE_SHARE of
# the pipeline's time or more, ``fetch-cache`` says how large a local cache of one pass is: the
# bodies' bytes a sample (counted in the timed batches: NOTE [ Unprofiled batches ] in
# collect/torch/loader.py) times a full pass's samples. Its promise is the what-if's: the loader
# with the fetch stages free (``cached``), at the workers there are, from the second epoch on.
CACHE_SHARE = 0.25
CACHE_WARN = 0.5  # a warning from this share


def rule_fetch_cache(report: dict[str, Any], facts: dict[str, Any]) -> Finding | None:
    """Every pass fetched its data again (NOTE [ A cache for later epochs ])."""
    rows = report.get("fetch") or []
    passes = (report.get("accounting") or {}).get("epochs") or []
    total = facts.get("pipeline_s")
    stages = report.get("stages") or {}
    paths = [p for p in stages if p.endswith("/fetch")]
    if not rows or len(passes) < 2 or not total or not paths:
        return None
    fetch_s = sum(stages[p]["total_s"] for p in paths)
    share = fetch_s / total
    nbytes = sum(r["bytes"] for r in rows)
    timed = timed_samples(report)
    if share < CACHE_SHARE or not nbytes or not timed:
        return None
    mb = nbytes / timed * max(passes) / 1e6
    n = facts["n_workers"]
    model = from_report(report, int(facts["cores"]))
    known = {s.path for s in model.stages} if model is not None else set()
    now = then = None
    if model is not None and set(paths) <= known:
        now, then = throughput(model, n), throughput(cached(model, paths), n)
    said = (f"; the loader alone would run at about {then:.0f} samples/s from the second epoch "
            f"on, against {now:.0f} now (the what-if with the fetch cached, {n} workers)"
            if now and then else "")  # fmt: skip
    return finding(
        "fetch-cache",
        "warning" if share >= CACHE_WARN else "info",
        paths[0],
        f"each of the {len(passes)} passes fetched its data over the network again: the fetch is "
        f"{share:.0%} of the pipeline's time, about {mb:.3g} MB a pass",
        {"passes": len(passes), "share": round(share, 4), "fetch_s": round(fetch_s, 6),
         "cache_mb": round(mb, 3), "samples_per_pass": max(passes),
         "samples_per_s_now": round(now, 1) if now else None,
         "samples_per_s_cached": round(then, 1) if then else None},
        f"keep what the first epoch fetched on local disk, about {mb:.3g} MB (WebDataset(urls, "
        "cache_dir=...), fsspec's 'filecache::' URLs, or a copy made once before training), so "
        f"that later epochs read it locally{said}; the first epoch still fetches",
    )


FETCH_RULES = [rule_fetch_cache]
