"""A dataset that fetches its samples over the network, for ``bench_encodings``: what its
requests take, and the rows for objects that hold more samples and for requests in flight.

NOTE [ Larger objects and requests in flight, benched ]
``fetched`` calls ``dataset[i]`` once for each fixed sample with pipeprof's timing of network
reads on (NOTE [ Timing network reads ] in collect/fetch.py), inside a ``load`` stage of its
own: the requests a sample makes, their wait for the first byte (latency) and their bodies'
reading, by the same clocks a profile reads. Where the latency takes LATENCY_BOUND of the fetch
or more, the model of the pipeline (``pipeprof.bench``'s) gets a row for each layout the
report's what-if names (NOTE [ Objects that hold a batch ] in analyze/fetch.py), with the same
arithmetic:

1. objects of ``S`` samples a request (a batch's, 4 batches', 16 batches': shards of that
   size): a sample keeps ``(1 / S) / (requests a sample now)`` of its requests' wait;
2. ``n`` requests in flight in each worker (a thread pool over a batch's samples, where each
   sample is a request now): a sample keeps ``1 / n`` of it.

``load`` loses the wait given up; the bodies' reading stays as measured (the same bytes at the
same rate a request), and so does the load's CPU (a request's own client work is not counted
out: the estimate errs on the side of less). Like every row, its rate is the model's gain over
the current row times the current row's rate measured in a real DataLoader run (NOTE
[ Anchored to a real run ] in bench/encodings.py).
"""

from __future__ import annotations

import copy
import sys
import time
from dataclasses import dataclass, replace
from typing import Any

from pipeprof.analyze import whatif
from pipeprof.analyze.fetch import IN_FLIGHT, LATENCY_BOUND, OBJECT_BATCHES
from pipeprof.bench.storage import close_opened
from pipeprof.collect import fetch as netreads
from pipeprof.core.recorder import counts, recorder

NET = (netreads.PATCH, netreads.PIPES, netreads.SYNC, netreads.AIO, netreads.HTTP, netreads.BOTO)


@dataclass(frozen=True)
class Fetched:
    """What a dataset's samples fetched over the network, a sample on average."""

    samples: int
    requests: int
    latency_ms: float  # the requests' wait for their first byte, a sample
    read_ms: float  # the bodies' reading, a sample
    bytes: int  # the bodies' bytes, all samples
    load_ms: float  # ``dataset[i]`` whole, a sample (wall)

    @property
    def per_sample(self) -> float:
        """Requests a sample."""
        return self.requests / self.samples

    def to_dict(self) -> dict[str, Any]:
        return {
            "samples": self.samples,
            "requests_per_sample": round(self.per_sample, 4),
            "latency_ms": round(self.latency_ms, 4),
            "read_ms": round(self.read_ms, 4),
            "bytes_per_sample": round(self.bytes / self.samples, 1),
            "load_ms": round(self.load_ms, 4),
        }


def fetched(source: Any, indices: list[int]) -> Fetched | None:
    """``source[i]`` for each of ``indices``, through a copy of ``source``, its network reads
    timed (NOTE [ Larger objects and requests in flight, benched ]); None where no request was
    made, or a sample failed (the bench says why elsewhere)."""
    rec = recorder()
    if rec.enabled:  # inside a running profile: its records are not this one's to take
        return None
    h5py = sys.modules.get("h5py")
    if h5py is not None and isinstance(source, h5py.Dataset):  # a file's array: no request
        return None
    try:  # read through a copy, as ``capture`` does: a file it opens lazily is not the user's
        reader = copy.copy(source)
    except Exception:
        return None
    sink, _ = rec.begin()
    patched = [patch for patch in NET if patch.install()]
    before = rec.enter(sink)
    t0 = time.perf_counter_ns()
    try:
        for i in indices:
            frame = rec.open("load")
            try:
                reader[i]
            finally:
                rec.close(frame)
    except Exception:  # a sample that fails: no figures, as for any other step that fails
        return None
    finally:
        wall = time.perf_counter_ns() - t0
        rec.leave(before)
        rec.end()
        for patch in patched:
            patch.uninstall()
        close_opened(reader, source)
    hosts = [e for e in (counts(sink).get("fetch") or {}).values() if isinstance(e, dict)]
    requests = sum(int(e["requests"]) for e in hosts)
    if not requests or not indices:
        return None
    n = len(indices)
    return Fetched(
        samples=n,
        requests=requests,
        latency_ms=sum(int(e["latency_ns"]) for e in hosts) / n / 1e6,
        read_ms=sum(int(e["read_ns"]) for e in hosts) / n / 1e6,
        bytes=sum(int(e["bytes"]) for e in hosts),
        load_ms=wall / n / 1e6,
    )


def layouts(model: whatif.Model, f: Fetched, batch: int
            ) -> list[tuple[dict[str, Any], whatif.Model]]:  # fmt: skip
    """A row's layout (``kind`` ``objects`` or ``in_flight``, its size, the fetch a sample
    after it, the basis) and the model with it, for each layout of NOTE [ Larger objects and
    requests in flight, benched ]; none where the fetch is not latency-bound."""
    total = f.latency_ms + f.read_ms
    if not total or f.latency_ms < LATENCY_BOUND * total:
        return []
    share = f"{f.latency_ms / total:.0%}"
    out = []
    for size in sorted({batch * m for m in OBJECT_BATCHES}):
        if f.per_sample <= 1 / size:
            continue
        keep = (1 / size) / f.per_sample
        layout = {"kind": "objects", "samples_per_request": size,
                  "basis": f"the requests' wait for their first byte ({share} of the fetch) "
                  f"shared by the {size} samples a request brings, the bodies' reading as "
                  "measured"}  # fmt: skip
        out.append(_shared(model, f, keep, layout))
    if f.per_sample >= 1:  # each sample a request (or more) now
        for n in sorted({min(x, batch) for x in IN_FLIGHT}):
            if n < 2:
                continue
            layout = {"kind": "in_flight", "requests_in_flight": n,
                      "basis": f"{n} requests a worker waiting for their first byte together "
                      f"({share} of the fetch), the bodies' reading as measured"}  # fmt: skip
            out.append(_shared(model, f, 1 / n, layout))
    return out


def _shared(model: whatif.Model, f: Fetched, keep: float, layout: dict[str, Any]
            ) -> tuple[dict[str, Any], whatif.Model]:  # fmt: skip
    """``model`` with ``keep`` of the requests' wait left to each sample's ``load``."""
    saved = f.latency_ms * (1 - keep)
    floor = {s.path: min(s.cpu_ms, s.wall_ms) for s in model.stages}  # waits no less than it works
    stages = tuple(
        replace(s, wall_ms=max(floor[s.path], s.wall_ms - saved)) if s.path == "load" else s
        for s in model.stages
    )
    layout["fetch_ms"] = round(f.latency_ms * keep + f.read_ms, 4)
    return layout, replace(model, stages=stages)


def label(layout: dict[str, Any]) -> str:
    """A layout's row name."""
    if layout["kind"] == "objects":
        return f"objects of {layout['samples_per_request']} samples"
    return f"{layout['requests_in_flight']} requests in flight"
