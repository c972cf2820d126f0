"""The torch rules: pure functions over the report's figures, each a Finding or None.

Each rule reads the report dictionary built so far and the shared facts
(``finding.pipeline_facts``); see docs/findings.md for thresholds and their sources.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from pipeprof.analyze.accounting import ACCOUNTING_RULES
from pipeprof.analyze.budget import Budget, budget, memory_cap
from pipeprof.analyze.fetch import FETCH_RULES, fetch_totals, per_request_rate
from pipeprof.analyze.finding import Finding, Severity, finding
from pipeprof.analyze.hangs import HANG_RULES
from pipeprof.analyze.hdf5 import H5_RULES
from pipeprof.analyze.loop import loop_floor, measured_rate
from pipeprof.analyze.memory import MEMORY_RULES
from pipeprof.analyze.scenarios import (
    FULL_CORES,
    cores_full,
    from_report,
    loop_rate,
    training_cores,
    worker_cpu_share,
)
from pipeprof.analyze.streams import STREAM_RULES
from pipeprof.analyze.tf_rules import TF_RULES
from pipeprof.analyze.tokens import TOKEN_RULES
from pipeprof.analyze.verdict import (
    MODERATE_WAIT,
    handover_overlapped,
    loader_saturated,
    loop_view,
    other_load,
)
from pipeprof.analyze.whatif import throughput, workers_to_feed
from pipeprof.core.regions import region_class

Rule = Callable[[dict[str, Any], dict[str, Any]], "Finding | None"]

DOMINANT_SHARE = 0.40  # a leaf stage above this share of pipeline time is called out
SATURATED_BUSY = 0.85  # workers busier than this cannot go faster without more of them
IMBALANCE = 1.30  # busiest worker / mean worker
SLOW_STARTUP = 0.25  # start-up above this share of wall time
RESTART_SHARE = 0.05  # workers restarted each epoch: what that costs, as a share of the loop


_FIXES = {
    "load/read": "reading is storage-bound: cache the data set in RAM or on a local SSD, pack "
    "small "
    "files into shards (WebDataset, TFRecord), or add workers so that reads overlap",
    "load/decode": "store the images pre-resized to the training resolution, decode at reduced "
    "size (PIL's Image.draft), or use a faster decoder (torchvision.io.decode_jpeg, on the GPU "
    "with device='cuda'; pillow-simd)",
    "load": "split it with pipeprof.stage('read') / pipeprof.stage('decode') inside __getitem__ to "
    "see which part costs",
}


def fetch_fix(rows: list[dict[str, Any]], batched: str = "") -> str:
    """The fix for a pipeline limited by its network reads (docs/streaming.md): by whether the
    requests' latency or their bodies' transfer takes most of the fetch; ``batched``: what
    fetching a batch's samples in one request would give (``per_request_rate``)."""
    latency, total, requests = fetch_totals(rows)
    if not total or not requests:
        return "make load/fetch cheaper, or move it off the per-sample path"
    mean = latency / requests * 1e3
    if latency >= 0.5 * total:
        return (
            f"each request waits {mean:.3g} ms for its first byte, {latency / total:.0%} of the "
            "fetch: the latency limits it, not the bandwidth. Keep more requests in flight (more "
            "workers, which wait without using a core: see the what-if; or a thread pool over a "
            "batch's samples in __getitems__), fetch larger objects that hold many samples "
            f"(shards), so that each wait pays for more of them{batched}, and cache what later "
            "epochs read again"
        )
    rate = sum(r["bytes"] for r in rows) / 1e6 / max(total - latency, 1e-9)
    return (
        f"the bodies take {1 - latency / total:.0%} of the fetch, at {rate:.3g} MB/s a request: "
        "fetch fewer bytes (smaller encodings, resized images) or read from a closer store, "
        "and cache what later epochs read again"
    )


def _batched(report: dict[str, Any], facts: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """What objects of a batch's samples would give the loader (NOTE [ Objects that hold a
    batch ] in analyze/fetch.py), as the fetch fix says it, and its figures for the finding's
    evidence; ("", {}) where it cannot be said."""
    size = round((report.get("samples") or 0) / max(1, report.get("batches") or 0))
    rates = per_request_rate(report, facts, size) if size > 1 else None
    if rates is None:
        return "", {}
    now, then = rates
    said = (f" (objects of a batch's {size} samples, one request a batch: the loader alone at "
            f"about {then:.0f} samples/s against {now:.0f} now, the what-if at "
            f"{facts['n_workers']} workers)")  # fmt: skip
    return said, {"samples_per_request": size, "samples_per_s_now": round(now, 1),
                  "samples_per_s_batched": round(then, 1)}  # fmt: skip


def tokenize_fix(tok: dict[str, Any]) -> str:
    """The fix for a pipeline limited by its tokenizer's calls (docs/tokens.md): by how many
    texts a call took and whether the tokenizer releases the GIL."""
    per_call = tok["texts"] / tok["calls"]
    if per_call < 2:
        return (
            f"the tokenizer is called once a text ({tok['ms_per_call']:.3g} ms a call): worth "
            "trying, judged by the whole pipeline: call it once a batch, with the batch's texts, "
            "in the collate_fn (tokenizer(texts, padding=True, return_tensors='pt')) or in a "
            "batched .map(), which encodes the list in one call"
            + (", in Rust" if tok["releases_gil"] else "")
        )
    if tok["releases_gil"] is False:
        return (
            "a Python tokenizer holds the GIL while it encodes: load the fast one "
            "(AutoTokenizer.from_pretrained(..., use_fast=True)), or run it in more workers"
        )
    return (
        f"the tokenizer already takes {per_call:.3g} texts a call: tokenize once, ahead, with a "
        "batched .map() saved with save_to_disk(), so that each epoch reads token ids"
    )


def rule_dominant_stage(report: dict[str, Any], facts: dict[str, Any]) -> Finding | None:
    path, total = facts["limiting"], facts["pipeline_s"]
    if path is None or not total or report.get("framework") == "tf":  # tf: see tf_rules.py
        return None
    row = report["stages"][path]
    share = row["total_s"] / total
    if share < DOMINANT_SHARE:
        return None
    more: dict[str, Any] = {}
    if path == "collate":
        fix = collate_fix(report.get("meta") or {})
    elif path.endswith("/fetch") and report.get("fetch"):
        said, more = _batched(report, facts)
        fix = fetch_fix(report["fetch"], said)
    elif path.endswith("/tokenize") and (report.get("tokens") or {}).get("tokenizer"):
        fix = tokenize_fix(report["tokens"]["tokenizer"])
    elif path in _FIXES:
        fix = _FIXES[path]
    elif path.startswith("transform/"):
        where = " on the GPU" if _has_gpu(report) else ""
        fix = (
            f"{path.split('/')[-1]} runs once per sample: apply it to whole batches{where} "
            "(torchvision.transforms.v2 works on batched tensors), precompute it offline "
            "if it is deterministic, or make it cheaper"
        )
    elif path.startswith("transfer/"):
        fix = "see the transfer findings: pin_memory=True with non_blocking copies"
    else:
        fix = f"make {path} cheaper, or move it off the per-sample path"
    return finding(
        "dominant-stage",
        "warning" if share >= 0.6 else "info",
        path,
        f"{path} takes {share:.0%} of the pipeline's time "
        f"({row['per_sample_ms']:.3g} ms per sample)",
        {
            "share": round(share, 4),
            "per_sample_ms": row["per_sample_ms"],
            "total_s": row["total_s"],
            **more,
        },
        fix,
    )


def collate_fix(meta: dict[str, Any]) -> str:
    """What to change when collate costs most, for what this loader's collate is and what its
    samples hold (``meta["collate_fn"]``, ``meta["sample_kinds"]``: collect/torch/loader.py).
    Moving the work into the dataset moves its cost to ``load`` rather than removing it (an HF
    tokenizer asked for tensors cost 1.8x more in load than it saved in collate: the whole
    pipeline paid 23 % more), so none of these is promised: each is worth trying, judged by the
    whole pipeline's time."""
    fn = meta.get("collate_fn")
    kinds = set(meta.get("sample_kinds") or ())
    whole = "; judge it by the whole pipeline's time, as work moved into the dataset costs there"
    if fn and fn not in ("default_collate", "default_convert"):
        return (f"worth trying, not measured: make the collate_fn {fn} cheaper (pad to a few "
                f"fixed lengths, avoid Python loops over samples), or give it more workers{whole}")
    if kinds & {"list", "number"} and "tensor" not in kinds:
        return ("worth trying, not measured: the samples are Python lists and numbers, which "
                "default_collate turns into tensors one element at a time: return NumPy arrays or "
                f"tensors from the dataset, or batch inside it with __getitems__{whole}")
    if kinds and kinds <= {"tensor", "ndarray", "number"}:
        return ("worth trying, not measured: the samples are already arrays, so collate's time is "
                "copying them into one batch: keep them small (uint8 until the GPU, crop before "
                "batching), or batch inside the dataset with __getitems__ (one read, no copy)")
    return ("worth trying, not measured: return tensors (not Python lists) from the dataset, or "
            f"batch inside it with __getitems__{whole}")


def _has_gpu(report: dict[str, Any]) -> bool:
    """The run has a GPU to move work to: one was sampled, or batches went to a CUDA device."""
    device = str((report.get("meta") or {}).get("device") or "")
    return bool((report.get("gpu") or {}).get("available")) or device.startswith("cuda")


def rule_more_workers(report: dict[str, Any], facts: dict[str, Any]) -> Finding | None:
    n, cores, rate = facts["n_workers"], facts["cores"], facts["rate"]
    if rate is None:
        return None
    target = max(1, cores - 1)  # leave a core for the training process
    if n == 0:
        if training_cores(report, int(cores)):  # CPU training: workers-needed weighs it
            return None
        alone = "the loader alone" if report.get("loop") else "it"
        return finding(
            "no-workers",
            "warning",
            facts["limiting"],
            f"loading runs in the training process (num_workers=0) at {rate:.0f} samples/s",
            {"samples_per_s_per_worker": round(rate, 1), "cores": cores},
            f"num_workers={target}: {alone} would give about {rate * target:.0f} samples/s "
            f"({target} × {rate:.0f}), and loading would overlap compute",
        )
    busy = facts["busy_mean"] or 0.0
    if busy < SATURATED_BUSY or n >= target:
        return None
    return finding(
        "workers-saturated",
        "info",
        facts["limiting"],
        f"the {n} workers are busy {busy:.0%} of the time; each delivers {rate:.0f} samples/s",
        {
            "busy_fraction": round(busy, 4),
            "samples_per_s_per_worker": round(rate, 1),
            "num_workers": n,
            "cores": cores,
        },
        f"num_workers={target} would give about {rate * target:.0f} samples/s on {cores} cores",
    )


def rule_oversubscribed(report: dict[str, Any], facts: dict[str, Any]) -> Finding | None:
    """More workers than cores, where the workers compute (their CPU time at least half their
    busy time): workers that wait on storage or the network are right to outnumber the cores
    (the what-if model scales them past the cores), so they get no finding. A hint: what fewer
    workers save (switching, memory) is not measured."""
    n, cores = facts["n_workers"], facts["cores"]
    threads = int(report.get("meta", {}).get("torch_threads") or 1)
    if n <= cores:
        return None
    ws = [w for w in facts["workers"] if w.get("cpu_s") is not None and w["busy_s"] > 0]
    cpu_share = sum(w["cpu_s"] for w in ws) / sum(w["busy_s"] for w in ws) if ws else None
    if cpu_share is not None and cpu_share < 0.5:
        return None
    share = "n/a" if cpu_share is None else f"{cpu_share:.0%}"
    return finding(
        "cpu-oversubscribed",
        "info",
        None,
        f"{n} workers (+ the main process with {threads} intra-op threads) share {cores} cores, "
        f"and the workers compute (CPU {share} of their busy time)",
        {"num_workers": n, "cores": cores, "torch_threads": threads, "cpu_share": cpu_share},
        f"worth trying, not measured: num_workers={max(1, cores - 1)} leaves a core to the "
        "training process; workers beyond the cores add switching and memory, not CPU",
    )


def rule_imbalance(report: dict[str, Any], facts: dict[str, Any]) -> Finding | None:
    ws = [w for w in facts["workers"] if w["busy_s"] > 0]
    if len(ws) < 2:
        return None
    mean = sum(w["busy_s"] for w in ws) / len(ws)
    top = max(ws, key=lambda w: w["busy_s"])
    ratio = top["busy_s"] / mean
    if ratio < IMBALANCE:
        return None
    return finding(
        "worker-imbalance",
        "info",
        None,
        f"worker {top['id']} is busy {ratio:.2f}× the mean worker",
        {"busiest_busy_s": top["busy_s"], "mean_busy_s": round(mean, 6), "ratio": round(ratio, 3)},
        "worth trying, not measured: samples differ a lot in cost: sort or bucket them by size, "
        "or shard an IterableDataset evenly across workers (get_worker_info())",
    )


GC_SHARE = 0.05  # the workers' full collections from this share of their busy time get a finding
PAGE = 4096  # bytes a page fault copies, on the usual 4 KiB pages


def rule_full_gc(report: dict[str, Any], facts: dict[str, Any]) -> Finding | None:
    """Full garbage collections in forked workers, over the heap they inherit (NOTE [ A full
    collection after fork ] in collect/torch/loader.py)."""
    ws = [w for w in facts["workers"] if w.get("gc_full")]
    busy = sum(w["busy_s"] for w in facts["workers"])
    gc_s = sum(w["gc_s"] for w in ws)
    if not ws or not busy or gc_s < GC_SHARE * busy:
        return None
    full, faults = sum(w["gc_full"] for w in ws), sum(w["gc_faults"] for w in ws)
    return finding(
        "full-gc-after-fork",
        "warning",
        None,
        f"the workers spent {gc_s / busy:.0%} of their busy time ({gc_s:.3g} s of {busy:.3g}) in "
        f"{full} full garbage collections, each over the whole heap a worker inherits from the "
        f"training process: {faults:,} page faults, about {faults * PAGE / 2**20:,.0f} MB copied",
        {"gc_s": round(gc_s, 6), "busy_s": round(busy, 6), "collections": full, "faults": faults},
        "gc.collect() then gc.freeze() in the training process just before each pass over the "
        "loader (`for batch in loader`): its workers fork from a collected heap that their own "
        "collections then skip (on a loop whose workers fill a cache, 0.52 s to 0.35 s); where "
        "only the inherited counters set them off, gc.collect() alone is the better fix (a "
        "loop of 160 px JPEGs with 2 workers ran 22 % faster, 16 % with gc.freeze() after it: "
        "docs/validation/diagnosis.md); with persistent_workers=True the workers copy it once, "
        "not every epoch (worth trying, not measured)",
    )


def rule_slow_startup(report: dict[str, Any], facts: dict[str, Any]) -> Finding | None:
    """Workers started again every epoch (``persistent_workers=False``), where that cost the loop
    at least ``RESTART_SHARE`` of its time: the later epochs' first waits, less what a kept
    worker still needs for an epoch's first batch (one batch of its own work), is what
    ``persistent_workers=True`` saves, and the finding says so. A first epoch's start-up is
    paid with or without it: where only that is slow (one pass seen), a hint, no promise."""
    meta = report.get("meta", {})
    if not meta.get("num_workers"):
        return None
    loop, wall = report.get("loop") or {}, report.get("wall_s")
    epochs = loop.get("epochs") or 1
    if loop and epochs >= 2 and not meta.get("persistent_workers"):
        later = max(0.0, (loop.get("startup_wait_s") or 0.0) - (loop.get("startup_s") or 0.0))
        ws = [w for w in facts["workers"] if w.get("batches")]
        batch_s = sum(w["busy_s"] / w["batches"] for w in ws) / len(ws) if ws else 0.0
        gain = max(0.0, later - (epochs - 1) * batch_s)
        loop_s = loop.get("wall_s") or wall or 0.0
        if not loop_s or gain / loop_s < RESTART_SHARE:
            return None
        return finding(
            "slow-startup",
            "warning" if gain / loop_s >= 0.2 else "info",
            None,
            f"epochs 2-{epochs} waited {later / (epochs - 1):.2f} s each for their first batch "
            f"({later:.2f} s, {later / loop_s:.0%} of the loop): the workers are started again "
            "every epoch",
            {"later_startups_s": round(later, 6), "epochs": epochs,
             "first_batch_s": round(batch_s, 6), "gain_s": round(gain, 6),
             "gain_fraction": round(gain / loop_s, 4), "loop_s": loop_s},
            f"DataLoader(persistent_workers=True) keeps the workers between epochs: about "
            f"{gain:.2f} s ({gain / loop_s:.0%} of the loop) to save over these {epochs} epochs, "
            f"as a kept worker still makes each epoch's first batch ({batch_s * 1e3:.0f} ms)",
        )
    start = report.get("startup_s")
    if not start or not wall or start / wall < SLOW_STARTUP:
        return None
    fix = (
        "worth trying, not measured: if the job runs several epochs, "
        "DataLoader(persistent_workers=True) pays the workers' start once (this profile saw "
        "one pass); the first epoch's start-up stays"
        if not meta.get("persistent_workers")
        else "start-up is a one-off; profile more batches to see the steady state"
    )
    return finding(
        "slow-startup",
        "info",
        None,
        f"the first batch took {start:.2f} s, {start / wall:.0%} of the profile",
        {"startup_s": start, "wall_s": wall},
        fix,
    )


def rule_pin_memory(report: dict[str, Any], facts: dict[str, Any]) -> Finding | None:
    meta = report.get("meta", {})
    device = str(meta.get("device") or "")
    if not device.startswith("cuda") or meta.get("pin_memory"):
        return None
    h2d = report["stages"].get("transfer/h2d", {})
    return finding(
        "pin-memory",
        "info",
        "transfer/h2d",
        f"batches are copied to {device} from pageable memory "
        f"({h2d.get('mean_ms') or 0:.3g} ms per batch)",
        {"h2d_mean_ms": h2d.get("mean_ms"), "pin_memory": False},
        "worth trying, not measured: DataLoader(pin_memory=True) and .to(device, "
        "non_blocking=True) let copies overlap compute; at most the copy's time is to gain",
    )


OWN_COST = 0.02  # pipeprof's own work above this share gets a finding


def rule_overhead(report: dict[str, Any], facts: dict[str, Any]) -> Finding | None:
    """pipeprof's own work where it could change what it reports: timed regions that add more
    than 2 % to the stage times, or samplers busier than 2 % of a core
    (docs/validation/overhead.md)."""
    o = report.get("overhead") or {}
    in_stages, cores = o.get("in_stages_fraction") or 0.0, o.get("sampler_cores") or 0.0
    frac = o.get("estimated_fraction")
    severity: Severity = "warning"
    if in_stages >= OWN_COST:
        message = f"pipeprof's timed regions add about {in_stages:.1%} to the stage times"
        fix = "stages are very short: time fewer, coarser stages"
        stages = report.get("stages") or {}
        if report.get("framework") == "tf" or all(_automatic(p) for p in stages):
            # no stage of the user's: nothing for them to coarsen, and the verdict and the
            # loop's figures do not rest on those few microseconds a stage
            severity = "info"
            message += (
                " (pipeprof times each transform of this fast pipeline on its own; the loop's "
                "figures are not affected)"
            )
            fix = (
                f"none needed: read the stage times as up to {in_stages:.1%} high; "
                "stage_every=32 times fewer batches if the run itself slows"
            )
    elif cores >= OWN_COST:
        message = f"pipeprof's samplers keep {cores:.1%} of a core busy"
        fix = "sample less often: pipeprof.Profiler(sample_hz=2), or sample_hz=0 to turn off"
    else:
        return None
    evidence = {"in_stages_fraction": in_stages, "sampler_cores": cores,
                "estimated_fraction": frac}  # fmt: skip
    return finding("profiler-overhead", severity, None, message, evidence, fix)


def _automatic(path: str) -> bool:
    """A stage pipeprof times by itself (a user's pipeprof.stage in __getitem__ is load/name)."""
    return path in ("load", "load/read", "load/decode", "collate") or path.split("/")[0] in (
        "transform",
        "transfer",
    )


def rule_workers_needed(report: dict[str, Any], facts: dict[str, Any]) -> Finding | None:
    """An input-bound (starved) loop: the workers that keep up with its steps, and the rate it
    will then run at: its steps when data is never late (compute, transfer, other regions and
    the hand-over no worker count removes; ``loop_floor``), or what those workers give."""
    loop = report.get("loop")
    rate, n, cores = facts["rate"], facts["n_workers"], facts["cores"]
    verdict = report["verdict"]
    if not loop or rate is None or verdict["kind"] != "input-bound":
        return None
    if verdict.get("cause") in ("hand-over", "start-up"):  # more workers do not help
        return None
    model = from_report(report, int(cores))
    overlapped = handover_overlapped(report)
    floor = loop_floor(loop, model.batch_size, not overlapped) if model is not None else None
    if floor is None or model is None:
        return None
    target = floor["samples_per_s"]
    now = (loop.get("throughput") or {}).get("effective_samples_per_s")
    occupied = training_cores(report, int(cores))
    if occupied:  # CPU training: the workers take cores from the step (NOTE in scenarios.py)
        return _cpu_shared(report, facts, model, floor, occupied, now)
    need = workers_to_feed(model, target)
    need = need if need is not None else max(1, math.ceil(target / rate))
    if need <= n:
        return None
    held = budget(report, int(cores))  # NOTE [ The workers' budget ] in budget.py
    cap, memory = memory_cap(held)
    wanted = need
    if cap is not None and need > cap > n:  # memory holds fewer: the most it holds
        need = cap
    will = min(target, throughput(model, need))
    evidence = {
        "workers_needed": need,
        "predicted_samples_per_s": round(will, 1),
        "samples_per_s_now": now,
        "loop_floor_samples_per_s": round(target, 1),
        "compute_ms_per_step": floor["compute_ms"],
        "handover_ms_per_step": floor["handover_ms"],
        "samples_per_s_per_worker": round(rate, 1),
        "num_workers": n,
        "cores": cores,
        "budget": held,
        "limited_by": memory if wanted > need or (cap is not None and cap <= n) else None,
    }
    if cap is not None and cap <= n:  # memory holds no more workers than it has
        return _memory_full(report, facts, evidence, wanted, memory)
    msg = (
        f"with {_workers(need)} the loop would run at about {will:.0f} samples/s"
        f"{with_startup(report, will, now, evidence, need, int(cores))} "
        f"(now {now or 0:.0f} with {_workers(n)}): its steps take {floor['step_ms']:.3g} ms when "
        f"data is ready ({floor['compute_ms']:.3g} ms compute, {floor['handover_ms']:.2g} ms "
        f"hand-over); each worker gives {rate:.0f} samples/s"
    )
    if wanted > need:
        msg += f"; {_workers(wanted)} would not fit in {_memory_said(held, memory, wanted)}"
    run = evidence.get("predicted_run_samples_per_s") or will
    if (need <= cores - 1 or _waiting_bound(report, int(cores))) and now and run < CPU_GAIN * now:
        # the pool's start-up takes what its rate gives, over a run this short: no promise
        msg += (
            f"; but over a run like this one, {need} workers' start-up "
            f"({evidence['startup_wait_s'] + evidence['added_start_s']:.2g} s) takes what "
            "they would gain"
        )
        return finding("workers-needed", "info", facts["limiting"], msg, evidence,
                       f"worth trying for longer runs, not measured: DataLoader(num_workers="
                       f"{need}, persistent_workers=True)")  # fmt: skip
    if need <= cores - 1 or _waiting_bound(report, int(cores)):
        fix = f"DataLoader(num_workers={need})"
        if wanted > need:
            fix += f" (the most that fit in {memory}; more need {_freed(memory)})"
    else:
        evidence["limited_by"] = "cores"
        fix = (
            f"{need} workers exceed the {cores} cores: make {facts['limiting']} cheaper "
            f"(it limits the pipeline), cache decoded data, or move augmentation to the GPU"
        )
    if n == 0:
        return _from_no_workers(facts, msg, evidence, fix, will / (now or will))
    return finding("workers-needed", "critical", facts["limiting"], msg, evidence, fix)


def _memory_said(held: Budget, memory: str | None, workers: int) -> str:
    """What ``workers`` workers would need of ``memory``, against what there is."""
    if memory == "RAM":
        return (f"RAM: each worker holds {held['worker_mb']:,.0f} MB of its own (USS) and the "
                f"machine had {held['available_mb']:,.0f} MB available")  # fmt: skip
    return (f"shared memory: /dev/shm holds the batches in flight ({held['batch_mb']:,.1f} MB "
            f"each) of {held['shm']} workers")  # fmt: skip


def _freed(memory: str | None) -> str:
    if memory == "RAM":
        return "less memory a worker (docs/findings.md#copy-on-read) or a larger machine"
    return "a larger /dev/shm (docs/findings.md#shm-too-small) or smaller batches"


def _memory_full(
    report: dict[str, Any], facts: dict[str, Any], evidence: dict[str, Any], wanted: int,
    memory: str | None,
) -> Finding:
    """Input-bound, and memory holds no more workers than the loader has."""
    held = evidence["budget"]
    return finding(
        "workers-needed",
        "critical",
        facts["limiting"],
        f"the loop needs {_workers(wanted)} to keep up, but {_workers(wanted)} would not fit "
        f"in {_memory_said(held, memory, wanted)}: no more than the {evidence['num_workers']} "
        "it has",
        evidence,
        f"make {facts['limiting']} cheaper (it limits the pipeline), or make room for more "
        f"workers: {_freed(memory)}",
    )


STARTUP_SHARE = 0.05  # a start-up from this share of the predicted run is priced in


def with_startup(
    report: dict[str, Any],
    will: float,
    now: float | None,
    evidence: dict[str, Any],
    need: int,
    cores: int,
) -> str:
    """The rate over a whole run like this one at a steady ``will`` samples/s with ``need``
    workers: its samples at that rate plus the start-up waits it paid (each epoch's first
    batches, as measured) and the forks of the workers it adds (``meta.worker_start_ms``
    each, measured: the training process starts them one after the other, every epoch unless
    they persist), into ``evidence``
    (``predicted_run_samples_per_s``, None where that start-up is under ``STARTUP_SHARE`` of
    the predicted run), and the words for the message. The share is of the run as it will be:
    of the run as it was, a start-up that the faster run makes a quarter of its time went
    unpriced (the held-out framework loop: 5-6 workers promised 2,972-3,419 samples/s,
    delivered 0.74-0.79 of it). On that loop (2 epochs of 32 batches, workers started again
    each epoch) the steady rate alone was met at 0.74-1.03 over the run
    (docs/validation/diagnosis.md)."""
    loop, meta = report["loop"], report.get("meta") or {}
    startup, wall = loop.get("startup_wait_s") or 0.0, loop.get("wall_s") or 0.0
    n = int(meta.get("num_workers") or 0)
    starts = 1 if meta.get("persistent_workers") else max(1, int(loop.get("epochs") or 1))
    # A start of the larger pool takes the start-up measured with n workers plus the forks of
    # the workers it adds: the training process forks them all, one after the other, before
    # the first batch. Forks beyond twice the cores slow as the workers already started compete
    # with the training process for them (the matrix's storage loop on 2 cores: about 0.11 s
    # to the first batch and 33 ms a worker measured with 2 workers; 6, 8 and 10 workers took
    # 0.28-0.34, 0.52 and 0.61 s).
    fork_s = (meta.get("worker_start_ms") or 0.0) / 1e3
    crowd = max(1.0, need / (2 * cores))
    pool = startup / starts + (need - n) * fork_s * crowd
    if meta.get("multiprocessing_context") not in (None, "fork") and n:
        # spawn, forkserver: each worker is a new interpreter that imports the user's modules
        # (torch: seconds of CPU) before its first batch, the pool at once on the cores: an
        # epoch's start measured with n workers, scaled to need on them (the matrix's storage
        # loop, spawn: 7 and 9 workers promised 128 and 60 samples/s over the run by the forks
        # alone, and ran 25 and 10)
        pool = max(pool, startup / starts * max(1.0, need / cores) / max(1.0, n / cores))
    forks = starts * max(0.0, pool - startup / starts) if need > n and fork_s else 0.0
    evidence["startup_wait_s"] = round(startup, 6)
    evidence["added_start_s"] = round(forks, 6)
    evidence["predicted_run_samples_per_s"] = None
    if not now or not wall or will <= 0:
        return ""
    samples = now * wall
    begin = startup + forks
    if begin < STARTUP_SHARE * (samples / will + begin):
        return ""
    run = samples / (samples / will + begin)
    evidence["predicted_run_samples_per_s"] = round(run, 1)
    return f" once started, {run:.0f} over a run like this one with its {begin:.2g} s of start-up"


BOUND_GAIN = 1.5  # the least upper-bound gain (x) for which workers are suggested from none


def _from_no_workers(
    facts: dict[str, Any], msg: str, evidence: dict[str, Any], fix: str, gain: float
) -> Finding:
    """From no workers no batch has been handed between processes: the rate is a bound, not a
    promise. Below ``BOUND_GAIN`` the hand-over may take all of it (a CPU loop, 200 kB
    batches: promised up to ×1.35, one worker ran it at ×0.86): a hint with no rate."""
    evidence["predicted_is_upper_bound"] = True
    if gain < BOUND_GAIN:
        hint = (
            f"loading runs in the training process; workers would overlap it with compute, "
            f"for at most ×{gain:.2f}, less the hand-over of each batch between processes, "
            "which a run with no workers cannot measure"
        )
        return finding("workers-needed", "info", facts["limiting"], hint, evidence,
                       f"worth trying, not measured: {fix}, then compare the two runs")  # fmt: skip
    msg = msg.replace("would run at about", "could run at up to") + UNMEASURED_HANDOVER
    return finding("workers-needed", "warning", facts["limiting"], msg, evidence,
                   f"worth trying: {fix}, then compare the two runs")  # fmt: skip


# A loop with no workers has handed no batch between processes: what that costs is unknown.
UNMEASURED_HANDOVER = (
    "; an upper bound: handing each batch from a worker to the training process costs time "
    "that a run with no workers cannot measure"
)


CPU_GAIN = 1.1  # the least gain (x) worth a fix when more workers take cores from the step
# The model's rate for the workers there are, this far under the measured one: its error is
# larger than the gain it would have to tell from none, so it does not say "no gain" (on loops
# it read 1.35x and 1.75x low, one more worker ran them 1.5x and 1.19x faster): said so
MODEL_SLACK = CPU_GAIN


def _cpu_shared(
    report: dict[str, Any],
    facts: dict[str, Any],
    model: Any,
    floor: dict[str, float],
    occupied: int,
    now: float | None,
) -> Finding | None:
    """``workers-needed`` on a CPU-only run: the worker count the loop is fastest with, once
    the step's share of the cores is counted; a fix only if it gains at least ``CPU_GAIN``."""
    n, cores = facts["n_workers"], int(facts["cores"])
    others = (other_load(report) or {}).get("other_cores", 0.0)
    here = loop_rate(model, floor, n, occupied, others)
    # a gain is counted from the faster of the model's rate for the workers there are and the
    # rate measured with them: where the model runs low (the step's threads taken as busy all
    # the time), its gain from its own figure is one the loop never had to gain (the README's
    # demo on 2 cores: 258 modelled, 329 measured with 2 workers; "3 workers: about 304"
    # promised x1.18, and 3 workers ran at 297-299)
    measured = measured_rate(report["loop"], model.batch_size)
    base = max(here, measured or 0.0)
    rates = {
        k: loop_rate(model, floor, k, occupied, others) for k in range(n + 1, max(n + 2, 4 * cores))
    }
    best = max(rates.values())
    need = min(k for k, r in rates.items() if r >= 0.97 * best)  # the fewest that get there
    will = rates[need]
    evidence = {
        "workers_needed": need,
        "predicted_samples_per_s": round(will, 1),
        "predicted_now_samples_per_s": round(here, 1),
        "samples_per_s_now": now,
        "measured_samples_per_s": round(measured, 1) if measured else None,
        "training_cores": occupied,
        "other_programs_cores": others,
        "loop_floor_samples_per_s": round(floor["samples_per_s"], 1),
        "compute_ms_per_step": floor["compute_ms"],
        "num_workers": n,
        "cores": cores,
    }
    busy = f"the training step keeps {occupied} of the {cores} cores busy while it computes"
    if will < CPU_GAIN * base and measured and here * MODEL_SLACK < measured:
        # no gain seen, by a model that reads the loop low: it under-reads more workers too,
        # so where it does see a gain over the measured rate, that promise stands
        msg = (
            f"pipeprof cannot tell whether more workers would speed this loop up: {busy}, so "
            f"loading in workers takes cores from it, and its model of that reads the loop at "
            f"{here:.0f} samples/s with {_workers(n)} where it ran at {measured:.0f}, too far "
            f"apart to predict from (the model: {will:.0f} with {_workers(need)})"
        )
        fix = (
            f"worth trying, not measured: the same run with DataLoader(num_workers={need}), "
            "compared with this one (pipeprof compare); making loading cheaper (the limiting "
            "stage) helps either way"
        )
        return finding("workers-needed", "info", facts["limiting"], msg, evidence, fix)
    if will < CPU_GAIN * base:
        # the model's rates and the measured one side by side, not a ratio of the two: its
        # error would read as the loop's change (the README's demo: "predicted ×0.39")
        gauge = (
            f"the model, before the cost of handing batches over: {will:.0f} samples/s with "
            f"{_workers(need)}, {here:.0f} with {_workers(n)}"
        )
        if measured:
            gauge += f"; the loop ran at {measured:.0f}"  # in the view the verdict reads
        msg = (
            f"more workers would not speed this loop up much: {busy}, so loading in workers "
            f"takes cores from it ({gauge})"
        )
        fix = (
            "none that more workers give: make loading cheaper (the limiting stage), cache "
            "decoded data, or train where the compute does not need the CPU (a GPU)"
        )
        return finding("workers-needed", "info", facts["limiting"], msg, evidence, fix)
    msg = (
        f"with {_workers(need)} the loop would run at about {will:.0f} samples/s"
        f"{with_startup(report, will, now, evidence, need, int(cores))} (now "
        f"{now or 0:.0f} with {_workers(n)}), counting that {busy}"
    )
    if need + occupied > cores:
        # computing workers beside the step, past the cores: how this machine's logical CPUs
        # share their work (hyper-threads do not add a core's worth each) and how long each
        # hand-over then waits for a busy worker was not measured (the diagnosis matrix: 3 ms
        # of Python a sample beside a 4 ms CPU step on 2 vCPUs, 4-5 workers promised 457-482
        # samples/s and ran 0.78-0.80 of it; with 1-2 workers before, 4-6 promised 395-402 and
        # ran 181-192, slower than before). Where the model held (torch work in the workers,
        # 3 workers: 184-187 promised, 187 run) it still gives its figure, as a hint.
        msg += f"; {need} workers beside the step exceed the {cores} cores, a regime not measured"
        return finding("workers-needed", "info", facts["limiting"], msg, evidence,
                       f"worth trying, not measured: DataLoader(num_workers={need}), then compare "
                       "the two runs (pipeprof compare); making loading cheaper (the limiting "
                       "stage) helps either way")  # fmt: skip
    if n == 0:
        fix = f"DataLoader(num_workers={need})"
        return _from_no_workers(facts, msg, evidence, fix, will / here)
    return finding("workers-needed", "critical", facts["limiting"], msg, evidence,
                   f"DataLoader(num_workers={need})")  # fmt: skip


def _workers(n: int) -> str:
    return "no workers" if n == 0 else "1 worker" if n == 1 else f"{n} workers"


def _waiting_bound(report: dict[str, Any], cores: int) -> bool:
    """The workers mostly wait (storage, network, sleep): more of them than cores still help.
    Not where the cores were full, over the profile or at the loop's rate: then they wait for
    a core (NOTE [ Full cores are not waiting ] in scenarios.py)."""
    workers = [w for w in report.get("workers") or [] if w.get("cpu_s") and w.get("busy_s")]
    # where the machine's cores were full with other work too (another program, a busy child
    # process), a computing worker gets its turn less often: only a far smaller CPU share is
    # waiting (the diagnosis matrix, 2 busy processes beside 2 Python workers and a CPU step:
    # 7 workers were a fix at the 0.5 line, and delivered 0.87 of it; storage workers there
    # use under 0.1 of their busy time)
    full = ((report.get("host") or {}).get("cpu_util_mean") or 0.0) >= 100 * FULL_CORES
    return (
        bool(workers)
        and sum(w["cpu_s"] for w in workers)
        < (0.25 if full else 0.5) * sum(w["busy_s"] for w in workers)
        and not cores_full(report, cores)
        # more workers than cores whose CPU fills them at the loop's rate take turns on the
        # cores, which stretches their busy time: they wait for a core, not for storage
        # (NOTE [ Workers past the cores ] in verdict.py; a spawn run's start-up in the
        # profile's wall hides that from cores_full)
        and not (report.get("verdict") or {}).get("workers_cores")
    )


HANDOVER_LOADER_SHARE = 0.2  # of the time between batches, for a loader profiled alone
BIG_BATCH_MB = 1.0


def rule_handover(report: dict[str, Any], facts: dict[str, Any]) -> Finding | None:
    """Batches that were ready but slow to reach the training process (NOTE [ Wait, split ]
    in collect/torch/loader.py): the queue, unpickling, shared memory, the pin-memory thread.
    More workers do not shorten it; fewer bytes per batch (with a GPU to convert them on) and
    fewer, larger batches do."""
    loop, wait = report.get("loop"), report.get("wait") or {}
    if handover_overlapped(report):  # the workers' capacity limits: NOTE in verdict.py
        return None
    if loop:
        view = loop_view(loop)
        frac = view.get("handover_fraction") or 0.0
        if not loop.get("wait_split_known") or frac < MODERATE_WAIT:
            return None
        ms = (view.get("handover_s") or 0.0) * 1e3 / max(1, view.get("steps") or 1)
        share = f"{frac:.0%} of step time"
    else:
        per_s = (report.get("steady") or {}).get("batches_per_s")
        ms = wait.get("handover_ms_per_batch") or 0.0
        frac = ms * per_s / 1e3 if per_s else 0.0
        if not wait.get("split_known") or frac < HANDOVER_LOADER_SHARE:
            return None
        if loader_saturated(report):  # busy workers: it overlapped the next batches' making
            return None
        share = f"{frac:.0%} of the time between batches"
    mb = wait.get("batch_mb")
    meta = report.get("meta") or {}
    pinned = bool(meta.get("pin_memory"))
    fixes = []
    # NOTE [ A hand-over that waits for a worker's GIL ]: with file_descriptor sharing, each
    # tensor received is rebuilt from a file descriptor that a thread of the worker that made it
    # hands over; that thread needs the worker's GIL, which the worker's Python holds while it
    # makes the next batch (up to the 5 ms switch interval a tensor). Where the workers are busy
    # (at least half their time) and compute (their CPU at least half their busy time, or the
    # cores full), that is the likely cause, and file_system sharing removes it (an earlier
    # diagnosis matrix: 4 workers with 16 ms of Python collate on 2 cores ran 266-287
    # samples/s; with file_system, 636-709; today's ran 724 and 823, bound by the cores: NOTE
    # [ Workers past the cores ] in verdict.py). Workers with slack hold no GIL long.
    busy = [w["busy_fraction"] for w in facts["workers"] if w.get("busy_fraction") is not None]
    gil = (
        meta.get("sharing_strategy") == "file_descriptor"
        and bool(busy)
        and sum(busy) / len(busy) >= 0.5
        and ((worker_cpu_share(report) or 0.0) >= 0.5 or cores_full(report, int(facts["cores"])))
    )
    if gil:
        fixes.append(
            "the workers compute in Python while each tensor's file descriptor waits for their "
            "GIL: torch.multiprocessing.set_sharing_strategy('file_system') at the start of the "
            "script hands tensors over without them (or use transforms that release the GIL)"
        )
    # uint8 only where the conversion lands on a GPU: on a CPU-only run it moves work into the
    # training process (followed on 19 MB float32 batches: the wait fell 4.4 -> 1.2 ms a step,
    # the run went from 1.17 to 1.49 s)
    if mb and mb >= BIG_BATCH_MB and _has_gpu(report):
        fixes.append(
            f"send fewer bytes ({mb:.3g} MB per batch): keep images uint8 in the workers (4× "
            "fewer bytes than float32) and convert and normalise on the device "
            "(x.to(device).float().div_(255), then normalise)"
        )
    fixes.append("larger batches pay the fixed part of each hand-over for more samples")
    if pinned:
        fixes.append(
            "pin_memory=True runs a pinning thread that competes with the loop for the CPU: "
            "measure with pin_memory=False"
        )
    if not gil:
        fixes.append(
            "with many tensors per batch, torch.multiprocessing.set_sharing_strategy("
            "'file_system') saves a file descriptor per tensor"
        )
    return finding(
        "handover",
        "warning",
        None,
        f"batches were ready but took {ms:.2g} ms each to reach the training process ({share}"
        + (f", {mb:.3g} MB per batch)" if mb else ")"),
        {
            "handover_ms_per_batch": round(ms, 4),
            "handover_fraction": round(frac, 4),
            "batch_mb": mb,
            "pin_memory": pinned,
            "num_workers": facts["n_workers"],
            "sharing_strategy": meta.get("sharing_strategy"),
            "waits_for_workers_gil": gil,
        },
        "; ".join(fixes) + f". At most the whole hand-over, {ms:.2g} ms per batch, is to gain; "
        "more workers do not shorten it",
    )


def rule_transfer(report: dict[str, Any], facts: dict[str, Any]) -> Finding | None:
    loop = report.get("loop")
    if not loop:
        return None
    frac = loop_view(loop).get("transfer_fraction") or 0.0
    if frac < MODERATE_WAIT:
        return None
    pinned = bool(report.get("meta", {}).get("pin_memory"))
    fix = (
        "DataLoader(pin_memory=True) and batch.to(device, non_blocking=True) overlap the copy "
        f"with compute: at most the copy's {frac:.0%} of step time to gain (not measured)"
        if not pinned
        else "copies are pinned already: send smaller batches (uint8 images, normalise on the "
        "GPU; not measured)"
    )
    return finding(
        "transfer",
        "warning",
        "transfer/h2d",
        f"copying batches to the device takes {frac:.0%} of step time",
        {"transfer_fraction": frac, "pin_memory": pinned},
        fix,
    )


EVERY_N = 10  # overhead-regions: the region run once every N steps, as the fix says


def rule_threads(report: dict[str, Any], facts: dict[str, Any]) -> Finding | None:
    """The training process's intra-op threads crowd the workers out: only on evidence of it
    (the loop waited for data and the cores were full: the training process's CPU time and the
    workers' together fill at least 85 % of them). Fewer training threads can then give the
    workers CPU, at some cost to compute, which nothing here measures: a hint, not a promise."""
    meta = report.get("meta", {})
    threads, n, cores = int(meta.get("torch_threads") or 0), facts["n_workers"], facts["cores"]
    verdict = report.get("verdict") or {}
    if not report.get("loop") or not threads or n + threads <= cores:
        return None
    if verdict.get("kind") != "input-bound":  # starved, or a hand-over slowed by full cores
        return None
    wall, main_ns = report.get("wall_s") or 0.0, meta.get("main_cpu_ns")
    if not wall or not isinstance(main_ns, int):
        return None
    main_cores = main_ns / 1e9 / wall
    worker_cores = sum(w.get("cpu_s") or 0.0 for w in report["workers"]) / wall
    if main_cores + worker_cores < FULL_CORES * cores:
        return None
    return finding(
        "threads-oversubscribed",
        "info",
        None,
        f"the cores were full while the loop waited for data: of {cores} cores, the training "
        f"process ({threads} intra-op threads) used {main_cores:.2g} and its {n} workers "
        f"{worker_cores:.2g}",
        {
            "num_workers": n,
            "torch_threads": threads,
            "cores": cores,
            "main_cores": round(main_cores, 3),
            "worker_cores": round(worker_cores, 3),
        },
        f"worth trying, not measured: torch.set_num_threads({max(1, cores - n)}) in the training "
        "process leaves the workers more CPU, but may slow its compute; compare the two runs",
    )


def rule_overhead_regions(report: dict[str, Any], facts: dict[str, Any]) -> Finding | None:
    """Non-compute regions take a moderate share of the step: the largest one that runs on
    most steps (at least one step in two) is named, with what running it every ``EVERY_N``
    steps would save. A region that ran once or a few times an epoch (validation at the epoch's
    end) is never told to run less often: it already does; nor does it count toward the share
    that makes the finding fire."""
    per_step_floor = 0.5  # a region's calls per step from which "every N steps" means a saving
    loop = report.get("loop")
    if not loop:
        return None
    frac = loop_view(loop).get("overhead_fraction") or 0.0
    if frac < MODERATE_WAIT:
        return None
    # the regions' CPU time, which the split counts, where their figures are CUDA events'
    timed = loop.get("host_regions") or loop["regions"]
    steps = loop.get("steps") or 0
    overhead = {k: v for k, v in timed.items() if region_class(k) == "overhead"}
    regions = {k: v for k, v in overhead.items()
               if steps and (v.get("count") or 0) >= per_step_floor * steps}  # fmt: skip
    if not regions:
        return None
    total = sum(v["total_s"] for v in overhead.values())
    frequent = frac * sum(v["total_s"] for v in regions.values()) / total if total else frac
    if frequent < MODERATE_WAIT:  # the share is the rare regions': nothing to run less often
        return None
    top = max(regions, key=lambda k: regions[k]["total_s"])
    top_s = regions[top]["total_s"]
    per_step = regions[top]["count"] / steps
    now = max(1, round(1 / per_step))  # it runs every step now, or every other one
    every = EVERY_N
    gain = top_s * (1 - now / every)  # the region's calls but one in N, as they cost now
    wall = loop.get("wall_s") or 0.0
    evidence = {"overhead_fraction": frac, "region": top, "region_s": top_s, "every": every,
                "per_step": round(per_step, 3), "gain_s": round(gain, 6),
                "gain_fraction": round(gain / wall, 4) if wall else None}  # fmt: skip
    saves = f": about {gain:.3g} s ({gain / wall:.0%} of the loop) to save" if wall else ""
    instead = "every step" if now == 1 else f"every {now} steps"
    return finding(
        "overhead-regions",
        "warning",
        None,
        f"non-compute regions take {frac:.0%} of step time; '{top}' is the largest "
        f"({top_s:.3g} s)",
        evidence,
        f"run '{top}' every {every} steps instead of {instead}{saves}; or asynchronously",
    )


RULES: list[Rule] = [
    rule_workers_needed,
    rule_handover,
    rule_transfer,
    rule_threads,
    rule_overhead_regions,
    rule_dominant_stage,
    rule_more_workers,
    rule_oversubscribed,
    rule_imbalance,
    rule_full_gc,
    rule_slow_startup,
    rule_pin_memory,
    *TF_RULES,  # tf.data's terms (tf_rules.py); None for torch reports
    *H5_RULES,  # h5py reads (hdf5.py); None without them
    *ACCOUNTING_RULES,  # the workers' samples (accounting.py)
    *MEMORY_RULES,  # the workers' memory (memory.py)
    *HANG_RULES,  # a wait for one batch far past any other (hangs.py)
    *TOKEN_RULES,  # token batches' padding (tokens.py)
    *STREAM_RULES,  # a streamed dataset's shuffle buffer at the start (streams.py)
    *FETCH_RULES,  # network reads made again every epoch (fetch.py)
    rule_overhead,  # last: within a severity, pipeprof's own measurement after the pipeline's
]
