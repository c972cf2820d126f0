"""The Forward, Backward and Optimizer regions ``pipeprof run`` times in each training step,
without code changes (NOTE [ Run ] in attach/run.py), and what they cost."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from pipeprof.attach.patches import Patches, patch_distributed
from pipeprof.collect.loop import StepLog
from pipeprof.core.recorder import clock
from pipeprof.core.regions import STEP_REGIONS
from pipeprof.report import Report

REGIONS_FIRST = 16  # NOTE [ Regions in a sample of the steps ]
REGIONS_EVERY = 8
REGIONS_AB_MIN = 8
_STEP_REGION_NS: list[float] = []
_QUIET_CALL_NS: list[float] = []
IN_SITU_MOST = 4.0  # NOTE [ What the wrappers cost ]: the in-situ factor at most


# NOTE [ Regions on a short path ]
# ``pipeprof run`` times Forward, Backward and Optimizer in every step. Through the
# Profiler's timer each one took a timer's start and end, its stack, its own statistics and
# the StepLog's classification: a few microseconds a region, three regions a step. While a
# pass runs on the CPU clock with no NVTX ranges (a plain ``Timer`` that has not turned to
# CUDA events), the regions go to the pass's StepLog directly (``StepLog.compute_region``):
# two clock reads and three appends. ``StepRegions.log`` is that StepLog, set with the run's
# ``current`` at each batch and cleared when profiling stops; else (CUDA events, NVTX) the
# timer's way.
#
# NOTE [ What the wrappers cost ]
# Every step goes through the wrappers, timed or quiet: the outermost Module call and each one
# inside it (counted in the timed steps, ``inner``), ``Tensor.backward``, the optimizer's two
# hooks. Their call-through is in neither arm of the timed steps' comparison (both arms pay it),
# so it is stated from a probe: the quiet Forward wrapper around a no-op against the no-op
# (``step_region_ns(quiet=True)``), for each of those calls in every step. Back to back, a probe
# runs warm; right after the user's torch code the same frames run colder: the timed steps'
# measured excess over their own probe, where the comparison is used, is that loop's factor (1
# to IN_SITU_MOST), and the call-through is scaled by it (``overhead.step_regions``:
# ``calls_per_step``, ``call_through_ns``, ``in_situ_factor``). So are the short path's frames
# inside each fetch of the fast path (``short_frames_ns`` in collect/torch/loader.py;
# ``meta["fast_path"]``). On issue 38's tiny step this states about 0.7 of what the step
# measures (docs/validation/run-cost.md): what pipeprof's frames slow in the user's own torch
# code beside them is larger than this factor says.
#
# NOTE [ Regions in a sample of the steps ]
# On that short path a loader's first REGIONS_FIRST steps time their regions, then one step in
# REGIONS_EVERY: the other steps are quiet (``quiet``, kept on their ``_Pass`` for a pass
# nested in them): the wrappers call straight through. In situ, right after the user's own torch
# code, the three regions cost a tiny CPU step about 14 µs, not the 2.5 µs they cost back to
# back (docs/validation/run-cost.md), and the user's code beside them slows too. Two things
# follow:
# - the regions' figures are of the timed steps; their totals are scaled to every step
#   (``meta["step_regions"]``, analyze/loop.py), as the loader's stages are;
# - the report states what they cost from the steps themselves: the compute of the timed
#   steps after the first against that of the quiet ones (``StepLog.region_arm``, arms True
#   and False), used from REGIONS_AB_MIN steps each when the difference is larger than its
#   standard error, else their count times one region's cost measured warm.


class StepRegions:
    """The regions of the step under way: where they go (``log``, else ``timer()``), whether this
    step times them (``quiet``: not), and which were seen.

    Args:
        timer: the current pass's Profiler timer, or None (no pass, or profiling stopped).
    """

    def __init__(self, timer: Callable[[], Any]) -> None:
        self.timer = timer
        # NOTE [ Regions on a short path ]: the current pass's StepLog while its regions can go
        # there directly; None: through its Profiler's timer (or not at all)
        self.log: StepLog | None = None
        self.quiet = False  # NOTE [ Regions in a sample of the steps ]: this step times none
        # Optimizer regions open: when (None: the timer's; 0: a quiet step's, not timed)
        self._opt_starts: list[int | None] = []
        self.seen: set[str] = set()  # the regions seen
        self.depth = 0  # 1 while the outermost Module call runs (the Forward region)
        self.inner = 0  # Module calls inside Forward, in the steps that timed it

    def install(self, run: Any, patches: Patches, local: Any) -> None:
        """Patch ``Tensor.backward``, ``Module.__call__``, the optimizer's global step hooks and
        DDP's collectives (``patch_distributed``), each undone through ``patches``."""
        import torch
        from torch.nn.modules import module as nn_module
        from torch.optim import optimizer as optim

        regions = self
        backward: Any = torch.Tensor.backward

        @functools.wraps(backward)
        def tensor_backward(tensor: Any, *args: Any, **kwargs: Any) -> Any:
            if regions.quiet:  # NOTE [ Regions in a sample of the steps ]
                return backward(tensor, *args, **kwargs)
            log = regions.log
            if log is not None:
                regions.seen.add("Backward")
                t0 = clock()
                try:
                    return backward(tensor, *args, **kwargs)
                finally:
                    log.compute_region("Backward", t0, clock() - t0)
            timer = regions.timer()
            if timer is None:
                return backward(tensor, *args, **kwargs)
            regions.seen.add("Backward")
            timer.start("Backward")
            try:
                return backward(tensor, *args, **kwargs)
            finally:
                timer.end("Backward")

        module_call = nn_module.Module.__call__
        compiling = torch.compiler.is_compiling

        def past(cls: type) -> None:  # NOTE [ Transforms past the Forward wrapper ]
            if "__call__" not in vars(cls):
                patches.replace(cls, "__call__", module_call)

        # Forward: the outermost Module call of the training step (``_forward``)
        __call__ = functools.wraps(module_call)(_forward(self, local, module_call, compiling, past))
        patches.replace(torch.Tensor, "backward", tensor_backward)
        patches.replace(nn_module.Module, "__call__", __call__)
        for hook in (
            optim.register_optimizer_step_pre_hook(self._optimizer_starts),
            optim.register_optimizer_step_post_hook(self._optimizer_ends),
        ):
            patches.add(hook.remove)
        if torch.distributed.is_available():
            patch_distributed(run)

    def _optimizer_starts(self, *args: Any) -> None:
        if self.quiet:  # NOTE [ Regions in a sample of the steps ]
            self._opt_starts.append(0)
        elif self.log is not None:
            self.seen.add("Optimizer")
            self._opt_starts.append(clock())
        else:
            self._opt_starts.append(None)
            self.open("Optimizer")

    def _optimizer_ends(self, *args: Any) -> None:
        t0 = self._opt_starts.pop() if self._opt_starts else None
        if t0 is None:
            self.close("Optimizer")
            return
        log = self.log
        if log is not None and t0:
            log.compute_region("Optimizer", t0, clock() - t0)

    def open(self, key: str) -> None:
        timer = self.timer()
        if timer is not None:
            timer.start(key)
            self.seen.add(key)

    def close(self, key: str) -> None:
        timer = self.timer()
        if timer is not None:
            try:
                timer.end(key)
            except ValueError:  # opened before the pass began: nothing to close
                pass


    def step_costs(self, entry: Any, s: Any, region_steps: int) -> None:
        """What the Forward / Backward / Optimizer regions cost the steps, in how many of them
        they were timed (NOTE [ Regions in a sample of the steps ]), and what the fast path
        cost (NOTE [ The fast path ]; NOTE [ What the wrappers cost ])."""
        factor = self._step_regions(entry, s, region_steps)
        fast_ns = entry.fast_ns
        if fast_ns:  # and the frames inside each fetch, as the wrappers' call-through
            from pipeprof.collect.torch.loader import short_frames_ns

            frames = short_frames_ns()
            fast_ns += int(entry.steps * frames * factor)
            s.meta["fast_path"] = {"frames_ns": round(frames, 1), "in_situ_factor": factor}
        s.costs["fast_ns"] = fast_ns

    def _step_regions(self, entry: Any, s: Any, region_steps: int) -> float:
        """What the Forward / Backward / Optimizer regions cost the steps, and in how many of
        them they were timed (NOTE [ Regions in a sample of the steps ]); returns the in-situ
        factor (NOTE [ What the wrappers cost ]; 1 where not measured)."""
        regions = s.loop.regions
        timed = sum(regions[k].count for k in STEP_REGIONS if k in regions)
        if not timed:
            return 1.0
        probed = timed * step_region_ns()
        on, off = entry.prof.step_log.region_ab if entry.prof is not None else ([0] * 3,) * 2
        meta: dict[str, Any] = {"steps": entry.steps, "timed_steps": entry.region_steps,
                                "first": REGIONS_FIRST, "every": REGIONS_EVERY,
                                "ab_steps": [on[0], off[0]], "probed_s": round(probed / 1e9, 6),
                                "used": False}  # fmt: skip
        timed_ns = probed
        factor = 1.0  # NOTE [ What the wrappers cost ]
        if min(on[0], off[0]) >= REGIONS_AB_MIN:
            means = [a[1] / a[0] for a in (on, off)]
            var = [max(0.0, a[2] / a[0] - m * m) / (a[0] - 1) for a, m in zip((on, off), means)]
            diff, se = means[0] - means[1], (var[0] + var[1]) ** 0.5
            meta.update({"per_step_ns": round(diff, 1), "se_ns": round(se, 1)})
            if diff > se:  # the timed steps' own excess, all in: the regions and what they displace
                timed_ns = diff * entry.region_steps
                meta["used"] = True
                factor = min(IN_SITU_MOST, max(1.0, timed_ns / probed)) if probed else 1.0
        # every step's wrappers call through, timed or quiet: the outermost Module call and
        # those inside it, the backward, the optimizer's two hooks
        seen = self.seen
        per_timed = self.inner / max(1, region_steps)
        calls = ("Forward" in seen) * (1 + per_timed) + ("Backward" in seen)
        calls += 2 * ("Optimizer" in seen)
        through = step_region_ns(quiet=True)
        through_ns = entry.steps * calls * through * factor
        meta.update({"calls_per_step": round(calls, 2), "call_through_ns": round(through, 1),
                     "in_situ_factor": round(factor, 2),
                     "call_through_s": round(through_ns / 1e9, 6)})  # fmt: skip
        s.costs["step_regions_ns"] = int(timed_ns + through_ns)
        s.meta["step_regions"] = meta
        return factor

    def note(self, report: Report) -> str:
        """Which parts of compute were seen, and what the rest is."""
        seen = [k for k in ("Forward", "Backward", "Optimizer") if k in self.seen]
        missing = [k for k in ("Forward", "Backward", "Optimizer") if k not in self.seen]
        text = (
            f"regions seen without code changes: {', '.join(seen)}" if seen
            else "no Forward/Backward/Optimizer regions seen (no torch model or optimizer ran "
            "inside the loop)"
        )  # fmt: skip
        data = report.to_dict()
        sampled = (data.get("meta") or {}).get("step_regions") or {}
        steps, timed = sampled.get("steps") or 0, sampled.get("timed_steps") or 0
        if seen and 0 < timed < steps:  # NOTE [ Regions in a sample of the steps ]
            text += (
                f" (timed in {timed:,} of {steps:,} steps: the first {sampled['first']}, then 1 "
                f"in {sampled['every']}; their totals scaled to every step)"
            )
        if missing and seen:
            text += f"; not seen: {', '.join(missing)}"
        loop = data.get("loop") or {}
        compute = loop.get("compute_s") or 0.0
        regions = loop.get("regions") or {}
        inside = sum(regions[k]["total_s"] for k in seen if k in regions)
        inside -= loop.get("comm_s") or 0.0  # DDP's all-reduce waits inside Backward
        if seen and compute > 0:
            rest = max(0.0, compute - inside)
            text += (
                f". The rest of compute, {rest:.3g} s of {compute:.3g} s, is the script's own "
                "code between them: moving the batch to the device, the loss, logging, metrics "
                "(Other)"
            )
        return text


# NOTE [ Transforms past the Forward wrapper ]
# Every Module call goes through the Forward wrapper (``_forward``), a torchvision transform's in
# a loader's fetch too: with ``num_workers=0`` that was a frame of pipeprof's in every sample. On
# an MNIST-style loader it was 3,600 of the 6,100 instructions a sample that ``pipeprof run``
# added to plain's 382,000 (benchmarks/inprocess_instructions.py, callgrind; docs/validation/
# run-cost.md). So a torchvision transform's class, once one of its instances is
# called in a fetch, calls torch's own ``Module.__call__`` from then on (``past``: set on the
# class, undone with the run's other patches). Only torchvision's transforms: a class of torch's
# (``nn.Sequential``) or the user's may be a model too, whose outermost call is the Forward.
TRANSFORMS = "torchvision.transforms"


def _forward(regions: Any, local: Any, module_call: Any, compiling: Any, past: Any) -> Any:
    """``Module.__call__`` with the Forward region: the outermost Module call of the training
    step. A wrapper on Module.__call__ costs an inner call about half a microsecond; torch's
    global forward hooks cost 7 (they take every call off torch's fast path) and about 11 with
    the work a hook does (benchmarks/run_cost.py). A Module called while this thread fetches a
    batch (``local.inside``: the loader's ``next()``, so the dataset's ``__getitem__``, its
    transforms and collate with ``num_workers=0``) is the pipeline's, not the model: a
    torchvision transform is a Module, and each of its calls was a Forward of its own. ``regions``
    is the run's StepRegions (or, in ``step_region_ns``, what it reads of one)."""

    def __call__(module: Any, *args: Any, **kwargs: Any) -> Any:
        # a step that times no regions (NOTE [ Regions in a sample of the steps ]), inside
        # another Module, or traced by torch.compile
        if regions.quiet:
            return module_call(module, *args, **kwargs)
        if regions.depth:  # inside Forward: counted, for what their call-through costs
            regions.inner += 1
            return module_call(module, *args, **kwargs)
        if local.inside:  # a batch being fetched: a transform, timed as a stage
            if type(module).__module__.startswith(TRANSFORMS):
                past(type(module))
            return module_call(module, *args, **kwargs)
        if compiling():
            return module_call(module, *args, **kwargs)
        log = regions.log
        if log is not None:  # NOTE [ Regions on a short path ]
            regions.seen.add("Forward")
            regions.depth = 1
            t0 = clock()
            try:
                return module_call(module, *args, **kwargs)
            finally:
                regions.depth = 0
                log.compute_region("Forward", t0, clock() - t0)
        timer = regions.timer()
        if timer is None:
            return module_call(module, *args, **kwargs)
        regions.seen.add("Forward")
        regions.depth = 1
        timer.start("Forward")
        try:
            return module_call(module, *args, **kwargs)
        finally:
            regions.depth = 0
            timer.end("Forward")

    return __call__


def step_region_ns(calls: int = 2000, quiet: bool = False) -> float:
    """Nanoseconds one Forward / Backward / Optimizer region costs a step on the short path
    (NOTE [ Regions on a short path ]): the Forward wrapper itself around a no-op, into a
    StepLog of its own, against the bare no-op calls; the median of three runs, measured once a
    process and kept (a few ms). ``quiet``: the wrapper calling straight through, as in a step
    that times none (NOTE [ Regions in a sample of the steps ])."""
    cached = _QUIET_CALL_NS if quiet else _STEP_REGION_NS
    if cached:
        return cached[0]
    from pipeprof.core.session import Session

    def noop(module: Any) -> None:
        return None

    class Host:  # what the wrapper reads of a StepRegions
        depth = 0
        inner = 0
        quiet = False
        log: StepLog | None = StepLog(Session())
        seen: set[str] = set()

    Host.quiet = quiet  # (``quiet = quiet`` in the class body would read a global)

    def never() -> bool:
        return False

    class Outside:  # what the wrapper reads of the run's thread-local state: no fetch under way
        inside = 0

    wrapped = _forward(Host(), Outside(), noop, never, noop)  # the Forward wrapper itself
    results = []
    for _ in range(3):
        t0 = clock()
        for _ in range(calls):
            wrapped(None)
        t1 = clock()
        for _ in range(calls):
            noop(None)
        results.append((2 * t1 - t0 - clock()) / calls)
    cached.append(max(0.0, sorted(results)[1]))
    return cached[0]
