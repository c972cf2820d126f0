"""Streamed datasets' own start-up (NOTE [ A shuffle buffer's start ]).

NOTE [ A shuffle buffer's start ]
A WebDataset sample shuffle (``.shuffle(bufsize, initial=100)``) holds ``initial`` samples
before it gives its first, and keeps filling towards ``bufsize`` as it gives them. The first
batch of an epoch therefore waits for ``initial`` samples to pass through every step before the
shuffle (the shard's fetch, the tar's reading, and whatever the user chained before it), in
each worker, every epoch (the pipeline's iterators are made again each pass, kept workers or
not). The profile has each step's time a sample (NOTE [ WebDataset pipelines ] in
collect/torch/dataset.py) and the shuffle's arguments (``meta["stream"]``), so the fill is
``initial`` times the steps upstream of the shuffle, a sample. Where that fill is at least half
of the first batch's wait, and the wait and what a smaller ``initial`` saves of it are each
``START_SHARE`` of the run or more, the ``shuffle-start`` finding says so: with ``initial`` at
the batch size, the first batch waits for about the fill of that many samples instead, and the
buffer still grows to ``bufsize`` (the first batches are mixed less widely; shuffling the
shards' order keeps them random). The reads are the same: the loop computes while the buffer
fills, where before it waited; a loop that waits for data waits for them later.
"""

from __future__ import annotations

from typing import Any

from pipeprof.analyze.finding import Finding, finding

START_SHARE = 0.10  # a first batch's wait from this share of the run on: worth a finding
FILL_SHARE = 0.5  # the shuffle's fill explains at least this share of that wait
START_WARN = 0.25  # a warning from this share of the run (SLOW_STARTUP in rules.py)


def rule_shuffle_start(report: dict[str, Any], facts: dict[str, Any]) -> Finding | None:
    """A sample shuffle whose initial fill is most of the first batch's wait (NOTE [ A shuffle
    buffer's start ])."""
    meta = report.get("meta") or {}
    stream = meta.get("stream") or {}
    stages = report.get("stages") or {}
    loop = report.get("loop") or {}
    start = loop.get("startup_s") if loop else report.get("startup_s")
    wall = (loop.get("wall_s") if loop else None) or report.get("wall_s")
    if not stream.get("shuffles") or not start or not wall or start / wall < START_SHARE:
        return None
    batch = max(1, int(meta.get("batch_size") or 1))
    steps = stream["steps"]
    best = None
    for shuffle in stream["shuffles"]:
        upstream = [p for p in steps[: shuffle["step"]] if p in stages]
        ms = sum(stages[p].get("per_sample_ms") or 0.0 for p in upstream)
        fill = shuffle["initial"] * ms / 1e3
        worth = shuffle["initial"] > 2 * batch and fill >= FILL_SHARE * start
        if worth and (best is None or fill > best[1]):
            best = (shuffle, fill, ms)
    if best is None:
        return None
    shuffle, fill, ms = best
    first, size = shuffle["initial"], shuffle["bufsize"]
    gain = min(start, (first - batch) * ms / 1e3)
    if gain / wall < START_SHARE:  # a wait worth cutting, not only a long one
        return None
    epochs = loop.get("epochs") or 1
    each = ", every epoch" if epochs > 1 else ""
    return finding(
        "shuffle-start",
        "warning" if start / wall >= START_WARN else "info",
        shuffle["stage"],
        f"the first batch waited {start:.2f} s ({start / wall:.0%} of the run){each}: the "
        f"shuffle buffer ({shuffle['stage']}) holds {first} samples before its first, and the "
        f"steps before it take {ms:.2f} ms a sample ({fill:.2f} s for {first})",
        {"startup_s": round(start, 6), "wall_s": round(wall, 6), "initial": first,
         "bufsize": size, "upstream_ms_per_sample": round(ms, 6), "fill_s": round(fill, 6),
         "gain_s": round(gain, 6), "epochs": epochs},
        f"shuffle({size}, initial={batch}): the first batch in about {start - gain:.2f} s "
        f"instead{each}, and the loop computes while the buffer fills (the reads are the same: "
        f"a loop that waits for data gains little later); the buffer still grows to {size} "
        "samples as they come, so only the first batches are mixed less widely (shuffle the "
        "shards' order too, WebDataset(..., shardshuffle=...), to keep them random)",
    )


STREAM_RULES = [rule_shuffle_start]
