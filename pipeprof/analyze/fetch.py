"""The network reads of a profile (NOTE [ Timing network reads ] in collect/fetch.py), a row per
host: requests, their latency, bytes and the rate a body came at."""

from __future__ import annotations

from typing import Any, TypedDict

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
