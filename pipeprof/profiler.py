"""The public entry points of collection: ``Profiler`` for a training loop, ``profile`` for a
data pipeline on its own. Each collects into a Session and hands it to a Report
(collect → Session → analyze → Report → render; docs/architecture.md)."""

from __future__ import annotations

import os
import re
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from pipeprof.collect import ranks
from pipeprof.collect.comm import CommClock, time_ddp
from pipeprof.collect.loop import HANG_S, GenericSource, StepLog, run_alone
from pipeprof.collect.machine import core_scaling
from pipeprof.collect.timer import Backend, Timer
from pipeprof.core.batch import batch_size
from pipeprof.core.detect import is_tf_dataset, is_torch_loader
from pipeprof.core.recorder import STAGE_EVERY, clock, measure_overhead, recorder
from pipeprof.core.session import SNAPSHOT_SPANS, Session, check_writable
from pipeprof.core.stats import Stat
from pipeprof.report import Report

# NOTE [ CPU training shares the cores ] (analyze/scenarios.py) reads the process's CPU time
# while the loop computes: taken on a step when CPU_GAP_NS of the clock have passed since the last
# step that took it (so every step of 20 ms or more, about one in 45 of 0.45 ms), scaled to every
# step (``Profiler.compute_cpu_ns``). On this project's VM a read of a CPU clock right after a
# training step cost 8-53 µs (after a backward, after a matmul whose intra-op thread ran on the
# other core), not the 1 µs it costs back to back: a read every step was most of what the step split
# cost (docs/validation/run-cost.md). Spread by time, the steps read are a fair sample of the run's;
# a pass's first 8 steps alone were not: one step of a CPU model beside a busy worker used 0.9-1.5
# cores, and 8 of them read the mean off by more than the rules' margin. The fast paths (by hand and
# under ``pipeprof run``) make the step due a read its way (``Profiler.cpu_read_at``): skipping them
# biased the sample to a pass's first steps.
CPU_GAP_NS = 20_000_000


class Wrapped:
    """What ``Profiler.wrap`` returns: each ``iter()`` is one timed pass (an epoch) of the data.

    A drop-in for the data it wraps: reading any other attribute reads the wrapped object's
    (``loader.dataset``, ``batch_size``, ``sampler``, ``num_workers``...), so code that logs
    ``len(loader.dataset)`` or checks ``loader.batch_size`` works on it unchanged."""

    def __init__(self, profiler: Profiler, data: Any, source: Iterable[Any]) -> None:
        self._profiler = profiler
        self._data = data
        self._source = source
        self._moves = getattr(source, "h2d", None) is not None
        self._it: Iterator[Any] | None = None

    def __iter__(self) -> Iterator[Any]:
        return self._profiler._pass_of(self._source, self._moves)

    def __next__(self) -> Any:  # ``next(prof.wrap(it))`` on an iterator, as before
        if self._it is None:
            self._it = iter(self)
        return next(self._it)

    def __len__(self) -> int:
        return len(self._data)  # the data's own TypeError when it has no length

    def __getattr__(self, name: str) -> Any:  # only for names Wrapped does not have itself
        if name.startswith("__") or "_data" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self._data, name)


# NOTE [ The fast path, by hand ]
# ``Profiler.wrap``'s pass over a DataLoader in the training process (num_workers=0) takes
# the fast path ``pipeprof run`` takes (NOTE [ The fast path ] in attach/run.py): the loader's pass
# says at each batch it yields how many of the next ones take the short path, and ``FastPass``
# fetches those past the two generators (the Profiler's steps and the loader's pass), keeping
# each step as a row in the StepLog, which the steps write when they are next asked. They are
# asked instead, and the step made its way, when anything else is due: another pass handed the
# last batch (a loader nested in the step, or two zipped), a region was counted for a class in
# the last step, DDP's communication is timed, the profile stopped, a stream snapshot is due
# (a GPU timer or NVTX ranges: no FastPass at all); and at the end of the batches. Its own time
# in ``next()`` is measured as it runs and stated with the loader's (``costs["fast_ns"]``),
# with the frames inside each fetch at their probe.
class FastPass:
    """One pass of ``Profiler.wrap`` over a loader with a short path (NOTE [ The fast path, by
    hand ]): an iterator, as the generator it stands for; ``close()`` ends the pass."""

    __slots__ = ("_cls", "_prof", "_short", "_source", "_steps", "mark")

    def __init__(
        self, prof: Profiler, steps: Iterator[Any], source: Any, short: Any, mark: list[int]
    ) -> None:
        self._prof, self._steps, self._source, self._short = prof, steps, source, short
        self._cls = prof._steps_log.classified
        # the last fast step's hand-over, where another pass wrote this one's fast steps: the
        # steps' generator takes it as its own (0: none)
        self.mark = mark

    def __iter__(self) -> FastPass:
        return self

    def __next__(self) -> Any:
        t_in = clock()
        prof, short = self._prof, self._short
        log = prof._steps_log
        if (
            short.left
            and t_in < prof.cpu_read_at
            and prof._last_pass is self.mark
            and log.classified == self._cls
            and prof._comm is None
            and prof._running
            and (prof.stream is None or time.monotonic() - prof._last_flush < prof.flush_s)
        ):
            try:
                batch = self._source.fast_next(short)
            except StopIteration:  # the pass ends its way
                pass
            else:
                log.fast.append((short.t0, short.t1, None, short.starved))
                prof._fast_steps += 1
                # its own time in next(), but for the fetch and the loader's bookkeeping
                prof._fast_ns += clock() - t_in - (short.t1 - short.t0) - short.own
                return batch
        batch = next(self._steps)
        prof._last_pass = self.mark
        self._cls = log.classified
        return batch

    def close(self) -> None:
        self._steps.close()  # type: ignore[attr-defined]


class Profiler:
    """Profiles a training loop: wrap its data, mark regions, get a Report.

    >>> prof = pipeprof.Profiler(device="cuda")
    >>> with prof:
    ...     for batch in prof.wrap(loader):        # the same batches as the plain loader
    ...         with prof.region("Forward"): ...
    >>> prof.report()

    Args:
        device: where each batch is moved (the copy is timed as ``transfer/h2d``); None: the
            batches stay where the loader puts them.
        sample_hz: the NVML and host samplers' rate, per second; 0 turns sampling off.
        gpus: the NVML indices to sample; None: the device's.
        stream: a file the session is saved to every ``flush_s`` seconds while the loop runs
            and at the end, so a crash loses at most that interval (a file per rank in a
            distributed job).
        flush_s: seconds between two saves to ``stream``.
        replay: batches kept for ``Profiler.replay`` (a compute-only baseline); 0 keeps none.
        timer: how regions are timed: ``"cpu"`` (the CPU clock), ``"cuda"`` (CUDA events) or
            ``"auto"`` (CUDA events once the script has initialised CUDA).
        nvml: the NVML module to sample with (tests pass a stand-in); None: ``pynvml``.
        event_factory: makes the CUDA events regions are timed with (tests pass a stand-in);
            None: ``torch.cuda.Event``.
        nvtx: also emit every stage (in the workers too), the loop's wait / transfer / compute
            and the regions as NVTX ranges for Nsight Systems (``pip install
            'pipeprof[nvtx]'``; with no CUDA device or NVTX tool nothing is emitted and the
            report's notes say so: docs/integrations.md).
        stage_every: time a DataLoader's stages in one batch in that many (in a pass of 16
            batches or more; the others run unprofiled and the stage totals are scaled to every
            sample); 1 times every batch, its regions then costing 8 times as much
            (docs/validation/overhead.md).
        live: show a panel in the terminal, refreshed once a second while the loop runs
            (throughput, the wait's share, the limiting stage, each worker's CPU, GPU and host;
            docs/live.md), where stdout and stderr are a terminal; the script's output scrolls
            above it.
        metrics_port: serve the live figures in Prometheus' text format on
            ``http://127.0.0.1:PORT/metrics`` (``"HOST:PORT"`` to bind elsewhere; a distributed
            rank adds its local rank to the port) while profiling runs; needs ``pip install
            'pipeprof[prometheus]'`` (docs/live.md).
        hang_s: a DataLoader's wait for one batch this long, and 10 times the longest gap
            between batches before it, is recorded as a hang: where each worker is, with its
            stack, in the report, a line on stderr, and a snapshot to ``stream`` (the job goes
            on); 0 turns it off (docs/findings.md#loop-hang).

    Raises:
        ValueError: ``sample_hz``, ``hang_s``, ``replay`` or ``stage_every`` is out of range,
            ``stream`` cannot be written, or ``metrics_port`` is neither a port nor
            ``"HOST:PORT"``.
    """

    def __init__(
        self,
        device: Any = None,
        *,
        sample_hz: float = 10.0,
        gpus: list[int] | None = None,
        stream: str | None = None,
        flush_s: float = 10.0,
        replay: int = 0,
        timer: Backend = "auto",
        nvml: Any = None,
        event_factory: Callable[[], Any] | None = None,
        nvtx: bool = False,
        stage_every: int = STAGE_EVERY,
        hang_s: float = HANG_S,
        live: bool = False,
        metrics_port: int | str | None = None,
    ) -> None:
        cpu0 = time.thread_time_ns()  # this thread's CPU here, as in start(): costs["control_ns"]
        _check_stage_every(stage_every)
        if isinstance(hang_s, bool) or not isinstance(hang_s, (int, float)) or not hang_s >= 0:
            raise ValueError(
                f"hang_s must be a number of seconds >= 0 (a wait for one batch at least this "
                f"long is recorded as a hang; 0 turns that off), got {hang_s!r}"
            )
        if isinstance(sample_hz, bool) or not isinstance(sample_hz, (int, float)) or sample_hz < 0:
            raise ValueError(
                f"sample_hz must be a number >= 0 (samples per second; 0 turns the GPU and host "
                f"samplers off), got {sample_hz!r}"
            )
        if isinstance(replay, bool) or not isinstance(replay, int) or replay < 0:
            raise ValueError(
                f"replay must be a whole number of batches >= 0 to keep for Profiler.replay(), "
                f"got {replay!r}"
            )
        if stream is not None:  # a file per rank in a distributed job (NOTE [ Ranks ])
            stream = str(ranks.rank_path(stream))
            _check_writable(stream, "stream")
        self.device = device
        self.sample_hz = sample_hz
        self.gpus = gpus
        self.stream = stream
        self.flush_s = flush_s
        self.replay_batches = replay
        self.stage_every = stage_every
        self.hang_s = hang_s
        # called from the hang watchdog's thread once it has recorded a hang (NOTE [ Hangs ] in
        # collect/torch/hangs.py): a snapshot of the report so far
        self.on_hang: Callable[[], None] | None = None
        self.live = live
        self._live: Any = None  # the live view while it shows (attach/live.py)
        self.metrics_port = None if metrics_port is None else str(metrics_port)
        if self.metrics_port is not None:
            from pipeprof.attach.metrics import parse_address

            parse_address(self.metrics_port)  # a bad one is refused now, not at start
        self._metrics: Any = None  # the Prometheus endpoint while it serves (attach/metrics.py)
        self._nvml_module = nvml
        self.session = Session(mode="loop")
        self._steps_log = StepLog(self.session)
        self._ranges: Any = None  # NVTX ranges (NOTE [ NVTX ranges ] in collect/ranges.py)
        if nvtx:
            from pipeprof.collect.ranges import open_ranges

            self._ranges = open_ranges(self.session.notes)
        args: dict[str, Any] = {"backend": timer, "event_factory": event_factory,
                                "on_cuda": self._timer_sinks}  # fmt: skip
        if self._ranges is not None:
            from pipeprof.collect.ranges import RangeTimer

            self.timer: Timer = RangeTimer(self._ranges, **args)
        else:
            self.timer = Timer(**args)
        self._timer_sinks(self.timer)  # "auto": again if it turns to CUDA events
        self._samplers: list[Any] = []
        self._nvml: Any = None
        self._running = False
        self._last_flush = 0.0
        self._cpu0 = 0
        self._cached: list[Any] = []
        self._twins: list[tuple[Any, Any]] = []
        # (start, end, the next step a start-up one, CPU ns between the records)
        self._gpu_events: list[tuple[Any, Any, bool, int]] = []
        self._stream_failed = False
        # the process's CPU time while the loop computed on the steps that read it (CPU_GAP_NS),
        # those steps' compute time, and all steps' compute time: ``compute_cpu_ns`` scales
        self._compute_cpu_ns = 0
        self._compute_cpu_wall_ns = 0
        self._compute_wall_ns = 0
        #: the clock from which the next step reads the process's CPU time (CPU_GAP_NS): a fast
        #: path makes such a step its way
        self.cpu_read_at = 0
        self._comm: CommClock | None = None
        # NOTE [ The fast path, by hand ]: the mark of the FastPass that handed the last
        # batch (not the pass: no cycle keeps a pass left early from closing; None: a pass
        # made its way), the fast steps and their own time
        self._last_pass: list[int] | None = None
        self._fast_steps = 0
        self._fast_ns = 0
        self.session.add_cost("control_ns", time.thread_time_ns() - cpu0)

    def compute_cpu_ns(self) -> int:
        """The process's CPU time while the loop computed, over every step: measured on a few
        (CPU_GAP_NS), scaled to all of them by their compute time."""
        if not self._compute_cpu_wall_ns:
            return 0
        return int(self._compute_cpu_ns * self._compute_wall_ns / self._compute_cpu_wall_ns)

    def _timer_sinks(self, timer: Timer) -> None:
        """CUDA events time the regions' figures; a step's split counts them by the CPU clock."""
        log = self._steps_log
        if timer.backend == "cuda":
            timer.set_sinks(log.region_timed, log.region_host)
        else:
            timer.set_sinks(log.region)

    # ---- lifecycle ------------------------------------------------------------------------

    def start(self) -> Profiler:
        """Start profiling. Starting a running Profiler does nothing (``wrap()`` starts it, and
        a framework's start hook may call ``start()`` too); one that has stopped cannot start
        again (one Profiler covers one continuous run).

        Returns:
            This Profiler (``with prof:`` starts it this way).

        Raises:
            RuntimeError: this Profiler has already profiled a run and stopped.
        """
        if self._running:
            return self
        if self.session.start_ns:
            raise RuntimeError(
                "this Profiler has already profiled a run and stopped: one Profiler covers one "
                "continuous run (put every epoch inside one `with prof:`), or create a new "
                "pipeprof.Profiler() for another run"
            )
        cpu0 = time.thread_time_ns()  # this thread's CPU in start() and stop(): costs["control_ns"]
        s = self.session
        s.meta["rank"] = ranks.current().to_dict()
        s.started_at = time.time()  # the wall clock at start_ns: a job's ranks line up by it
        s.start_ns = clock()
        self._cpu0 = time.process_time_ns()
        self._last_flush = time.monotonic()
        self._running = True
        if self._ranges is not None:
            from pipeprof.collect import ranges

            ranges.install()
        if self.sample_hz:
            from pipeprof.collect.samplers import HostSampler

            self._samplers.append(HostSampler(hz=self.sample_hz).start())
        if self.live:  # NOTE [ The live view ] in collect/live.py
            from pipeprof.attach.live import LiveView

            view = LiveView(lambda: self.loaders, self.gpu_latest)
            self._live = view if view.start() else None
        if self.metrics_port is not None:
            from pipeprof.attach.metrics import serve

            self._metrics = serve(self.metrics_port, lambda: self.loaders, self.gpu_latest,
                                  self.session.notes)  # fmt: skip
        s.add_cost("control_ns", time.thread_time_ns() - cpu0)
        return self

    @property
    def loaders(self) -> list[Any]:
        """The profiled DataLoaders (each a twin of one of the user's), for the live view."""
        return [twin for _, twin in self._twins]

    def gpu_latest(self) -> list[tuple[Any, Any]]:
        """The GPU sampler's latest (utilisation %, memory used MB) per device; [] without."""
        from pipeprof.collect.live import gpu_readings

        return gpu_readings(self._samplers)

    def stop(self, interrupted: bool = False) -> None:
        """Stop profiling: the samplers, the live view and the metrics endpoint end, the steps
        and the stages recorded so far go into the session, and it is saved to ``stream`` (if
        one was given). Stopping a Profiler that is not running does nothing.

        Args:
            interrupted: mark the run as cut short (``report["interrupted"]`` is True);
                ``with prof:`` passes True when its block raised.
        """
        if not self._running:
            return
        cpu0 = time.thread_time_ns()
        self._running = False
        if self._live is not None:  # the panel goes before the report prints
            self._live.stop()
            self._live = None
        if self._metrics is not None:
            self._metrics.stop()
            self._metrics = None
        if self._ranges is not None:
            from pipeprof.collect import ranges

            ranges.uninstall()
        self.timer.flush()
        self._resolve_gpu(block=True)
        self._steps_log.fold()
        s = self.session
        s.end_ns = clock()
        if self._fast_steps:  # NOTE [ The fast path, by hand ], with the frames in each fetch
            from pipeprof.collect.torch.loader import short_frames_ns

            s.add_cost("fast_ns", self._fast_ns + int(self._fast_steps * short_frames_ns()))
        s.meta["rank"] = ranks.current().to_dict()  # torch.distributed may be up by now
        s.meta["main_cpu_ns"] = time.process_time_ns() - self._cpu0
        s.meta["compute_cpu_ns"] = self.compute_cpu_ns()
        self._comm_meta()
        s.interrupted = s.interrupted or interrupted
        for sampler in self._samplers:
            sampler.stop()
        s.overhead_ns = measure_overhead()  # after the loop: calibrating is not the loop's time
        s.meta["core_scaling"] = core_scaling()  # cached per machine (collect/machine.py)
        self._collect_samplers()
        for _, twin in self._twins:  # NOTE [ Hangs ] in collect/torch/hangs.py: the watchdogs
            stop_watch = getattr(twin, "stop_watch", None)
            if stop_watch is not None:
                stop_watch()
        self._twins.clear()  # lets persistent workers of the profiled twins shut down
        payload = recorder().drain()
        if payload["events"]:
            s.merge(payload)
        s.add_cost("control_ns", time.thread_time_ns() - cpu0)
        s.settle_counted()
        if self.stream:
            self._save_stream()

    def __enter__(self) -> Profiler:
        return self.start()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.stop(interrupted=exc_type is not None)  # the exception itself propagates

    def report(self) -> Report:
        """The Report so far (works during, after, and after an exception in the loop).

        Returns:
            A new Report of the session as it is now; while the loop runs, regions timed by CUDA
            events that the GPU has not finished yet are left out.
        """
        if self._running:
            self._resolve_gpu(block=False)  # what the GPU finished, as the comm view below
        self._steps_log.fold()
        self._comm_meta()
        if self._running:
            self._collect_samplers()
            self.session.end_ns = clock()
            self.session.meta["compute_cpu_ns"] = self.compute_cpu_ns()
        return Report(self.session)

    # ---- regions --------------------------------------------------------------------------

    def region(self, key: str) -> Any:
        """A timed region (``Forward``, ``Backward``, ``Comm``, ``IO``, ``Other``, any name).

        Args:
            key: the region's name: any non-empty string.

        Returns:
            A context manager: ``with prof.region("Forward"):`` times the block by the
            Profiler's ``timer``, and closes the region even if the block raises.

        Raises:
            TypeError: ``key`` is not a str.
            ValueError: ``key`` is empty.
        """
        return self.timer.region(key)

    def time_comm(self, model: Any, hook: Any = None, state: Any = None) -> Any:
        """Time the gradient all-reduce of a ``DistributedDataParallel`` model as each step's
        ``comm`` (NOTE [ Comm ] in collect/comm.py). Call it instead of
        ``model.register_comm_hook(state, hook)`` (DDP takes one hook), before the first
        backward. Steps outside this Profiler's run are not timed.

        Args:
            model: the ``DistributedDataParallel`` model.
            hook: the communication hook to register, timed, as ``register_comm_hook`` takes
                it; None: DDP's own all-reduce (same results).
            state: the state DDP passes to ``hook``; ignored without ``hook`` (DDP's all-reduce
                gets the model's process group).

        Returns:
            ``model``, with the timed hook registered.
        """
        time_ddp(model, self.comm_target, hook, state)
        return model

    def comm_target(self) -> CommClock | None:
        """Where DDP's hook records, while this Profiler runs (None: DDP's steps outside it are
        not timed, and nothing piles up)."""
        return self.comm_clock() if self._running else None

    def comm_clock(self) -> CommClock:
        """Where DDP's all-reduce intervals for this Profiler's steps are kept."""
        if self._comm is None:  # GPU buckets' CUDA events where compute has them too
            cuda = self.timer.poll_cuda()
            self._comm = CommClock(events=self.timer._factory if cuda else None)
        return self._comm

    def _comm_meta(self) -> None:
        comm = self._comm
        if comm is not None:
            comm.resolve(block=not self._running)
            self.session.meta["comm"] = comm.to_dict()
            if comm.note and comm.note not in self.session.notes:
                self.session.notes.append(comm.note)

    # ---- the data ---------------------------------------------------------------------------

    def wrap(self, data: Iterable[Any], device: Any = None) -> Wrapped:
        """Iterate ``data`` (a DataLoader, a tf.data.Dataset or any iterable) and time each step.

        Like a DataLoader, the result can be iterated again (each pass is an epoch) and has the
        ``len()`` of ``data``. Starts the Profiler if it is not running.

        Args:
            data: a ``torch.utils.data.DataLoader``, a ``tf.data.Dataset`` or any iterable of
                batches. The same DataLoader wrapped again is profiled through the same copy,
                so its persistent workers persist across epochs.
            device: where each batch of a DataLoader or tf.data.Dataset is moved (the copy is
                timed as ``transfer/h2d``; the batches of another iterable are not moved);
                None: the Profiler's ``device``.

        Returns:
            A drop-in for ``data``: each ``iter()`` is one timed pass over its batches, and
            ``len()`` and any other attribute (``dataset``, ``batch_size``...) are ``data``'s.

        Raises:
            TypeError: ``data`` is not iterable.
            RuntimeError: this Profiler has already profiled a run and stopped.
        """
        device = device if device is not None else self.device
        started = not self._running
        if started:
            self.start()
        try:
            source = self._source(data, device)
        except BaseException:
            if started:  # bad input: no sampler left running for a loop that never starts
                self.stop()
            raise
        return Wrapped(self, data, source)

    def _source(self, data: Any, device: Any) -> Iterable[Any]:
        if is_torch_loader(data):
            from pipeprof.collect.torch.loader import ProfiledLoader

            # One twin per loader, so persistent workers persist across epochs.
            for loader, twin in self._twins:
                if loader is data:
                    return twin  # type: ignore[no-any-return]
            twin = ProfiledLoader(
                data, self.session, device, ranges=self._ranges, stage_every=self.stage_every,
                hang_s=self.hang_s,
            )
            twin.on_hang = self._hang_snapshot
            self._twins.append((data, twin))
            return twin
        if is_tf_dataset(data):
            from pipeprof.collect.tf.dataset import ProfiledDataset

            self.session.framework = "tf"
            return ProfiledDataset(data, self.session, device)  # type: ignore[no-any-return]
        if not hasattr(data, "__iter__"):
            raise TypeError(
                f"Profiler.wrap() needs an iterable of batches, got {type(data).__name__}"
            )
        return GenericSource(data, self.session)

    @property
    def plain_timer(self) -> bool:
        """Regions timed by the CPU clock alone: no CUDA events to mark at each step, no NVTX
        (a timer that is plain once stays plain: "auto" turns to CUDA only from unresolved)."""
        timer = self.timer
        return type(timer) is Timer and not timer._cuda and not timer._auto

    def _pass_of(self, source: Iterable[Any], moves: bool) -> Iterator[Any]:
        """One pass over ``source`` (``Wrapped.__iter__``): the steps' generator, or in the
        training process a FastPass over it (NOTE [ The fast path, by hand ])."""
        loader = getattr(source, "user_loader", None)
        if loader is None or loader.num_workers or not self.plain_timer:
            return self._steps(source, moves)
        t_open = clock()  # the pass begins here, as a plain iter() begins it
        opened, _, short = source.open(hand=True)  # type: ignore[attr-defined]
        mark = [0]
        steps = self._steps(source, moves, opened, t_open, mark)
        return steps if short is None else FastPass(self, steps, source, short, mark)

    # ---- for attachers: pipeprof run and the framework callbacks (pipeprof/attach) ------------

    @property
    def running(self) -> bool:
        """Between ``start()`` and ``stop()``."""
        return self._running

    @property
    def step_log(self) -> StepLog:
        """The loop's steps as they are written: a region counted in the step under way
        (``region``), the fast path's rows (``fast``, ``classified``), the regions' arms."""
        return self._steps_log

    @property
    def comm_timed(self) -> bool:
        """DDP's communication is timed in this Profiler's steps."""
        return self._comm is not None

    def release(self, loader: Any) -> None:
        """Let go of the profiled twin of ``loader``, with its dataset and any persistent
        workers: the loader is not iterated again.

        Args:
            loader: a DataLoader given to ``wrap``; one this Profiler holds no twin of is
                ignored.
        """
        self._twins[:] = [t for t in self._twins if t[0] is not loader]

    def begin_pass(self, data: Any) -> tuple[Iterator[Any], Any, Any, Any]:
        """A pass over ``data`` begun as a plain ``iter()`` begins it (its workers started).

        Args:
            data: what ``wrap`` takes: a DataLoader, a tf.data.Dataset or any iterable of
                batches.

        Returns:
            ``(steps, iterator, short, twin)``: the pass's steps (an iterator of the batches,
            timed step by step); for a DataLoader, torch's own iterator where the pass can
            answer for it (NOTE [ The user's own iterator ] in collect/torch/loader.py; else
            None) and the pass's short path (NOTE [ The fast path ] in attach/run.py; else
            None), both None for other data; and the profiled twin (for other data, the
            profiled source ``wrap`` made).

        Raises:
            TypeError: ``data`` is not iterable.
            RuntimeError: this Profiler has already profiled a run and stopped.
        """
        wrapped = self.wrap(data)
        source: Any = wrapped._source  # a ProfiledLoader for a DataLoader
        if not is_torch_loader(data):
            return iter(wrapped), None, None, source
        t_open = clock()
        opened, it, short = source.open(expose=True)
        return self._steps(source, wrapped._moves, opened, t_open), it, short, source

    def _steps(
        self, source: Iterable[Any], moves: bool, opened: Iterator[Any] | None = None,
        t_open: int = 0, mark: list[int] | None = None,
    ) -> Iterator[Any]:  # fmt: skip
        """One pass over ``source``, timed step by step; ``opened``: the pass, begun at
        ``t_open`` (its first step's wait is from then: ``pipeprof run``'s ``iter()``);
        ``mark``: its FastPass's (NOTE [ The fast path, by hand ])."""
        log = self._steps_log
        # a pass is an epoch from its start (h5py's reads after the first epoch are kept apart
        # by it), but one left after its first batch is a peek (next(iter(loader)) for shapes),
        # and is taken back when it closes; its step still counts
        log.record.epochs += 1
        delivered, ended = 0, False
        if opened is None:
            t_open = clock()  # a ProfiledLoader's pass begins in iter(): its workers start
            it = iter(source)
        else:
            it = opened
        warmup = getattr(source, "warmup_steps", 1)  # steps until every worker delivered once
        # A ProfiledLoader says how long its own bookkeeping took inside next() (never the
        # user's wait) and how long each batch kept the loop starved (NOTE [ Wait, split ])
        split = hasattr(source, "last_starved")
        # NVTX: ``compute`` here, ``wait`` too unless the source emits its own (with transfer)
        nv = self._ranges
        nv_wait = nv is not None and getattr(source, "ranges", None) is None
        depth = 0  # the ranges this generator has open
        handed = 0  # when the last batch went to the user (0: none yet)
        # the process's CPU time then, on a few steps (0: not this one; CPU_GAP_NS, NOTE [ CPU
        # training shares the cores ])
        cpu_handed = cpu_last = 0  # cpu_last: when a step last read it
        gpu_start: Any = None
        timer = self.timer
        # this generator's time between the user's parts (``loop_ns``), by the clock it reads
        # anyway: a CPU clock costs a system call each read, four a step
        own_ns = 0
        try:
            while True:
                if log.fast:  # NOTE [ The fast path, by hand ]: another pass's, written first
                    self._settle_other(mark)
                if mark is not None and mark[0]:  # this pass's, written by another
                    handed, cpu_handed, mark[0] = mark[0], 0, 0
                if handed:  # the step's compute ends; pipeprof's bookkeeping is in no part
                    t_end = clock()
                    if log.fast:  # NOTE [ The fast path ] in attach/run.py: the steps since
                        self._compute_wall_ns += log.settle()
                        handed, cpu_handed = log.handed, 0
                    if depth:
                        nv.pop()
                        depth = 0
                    if cpu_handed:
                        self._compute_cpu_ns += time.process_time_ns() - cpu_handed
                        self._compute_cpu_wall_ns += t_end - handed
                    self._compute_wall_ns += t_end - handed
                    if gpu_start is not None or timer._cuda or timer._auto:
                        gpu_start = self._gpu_mark(gpu_start, end=True, next_first=warmup > 0)
                    if self._comm is not None:
                        self._comm.fold(log, handed, t_end)
                    log.end(handed, t_end)
                if nv_wait:
                    nv.open("wait")
                    depth = 1
                t_req = clock()
                if handed:
                    own_ns += t_req - t_end
                elif not delivered:
                    t_req = t_open  # the first batch's wait: from the pass's start
                copied_before = source.transfer_ns if moves else 0  # type: ignore[attr-defined]
                own_before = source.own_ns if split else 0  # type: ignore[attr-defined]
                try:
                    batch = next(it)
                except StopIteration:
                    handed = 0
                    ended = True
                    return
                t_got = clock()
                if nv_wait:
                    nv.pop()
                    depth = 0
                transfer = (source.transfer_ns - copied_before) if moves else 0  # type: ignore[attr-defined]
                own = (source.own_ns - own_before) if split else 0  # type: ignore[attr-defined]
                wait = max(0, t_got - t_req - transfer - own)
                starved = source.last_starved if split else None  # type: ignore[attr-defined]
                log.begin(t_req, wait, transfer, warmup > 0, starved)  # clamped to the wait
                warmup -= 1
                if len(self._cached) < self.replay_batches:
                    self._cached.append(batch)
                if self.stream or (self._nvml is None and self.sample_hz):
                    self._maybe_flush()
                if timer._cuda or timer._auto:
                    gpu_start = self._gpu_mark(None, end=False)
                delivered += 1
                cpu_handed = time.process_time_ns() if t_got - cpu_last >= CPU_GAP_NS else 0
                if nv is not None:
                    nv.open("compute")
                    depth = 1
                handed = clock()
                if cpu_handed:
                    cpu_last = handed
                    self.cpu_read_at = handed + CPU_GAP_NS
                own_ns += handed - t_got
                log.handed = handed
                self._last_pass = None  # NOTE [ The fast path, by hand ]: a FastPass says it
                # NOTE [ A suspended pass holds no batch ] in collect/torch/loader.py
                held, batch = [batch], None
                yield held.pop()
        finally:
            if delivered == 1 and not ended:  # a peek: no epoch
                log.record.epochs -= 1
            self.session.add_cost("loop_ns", max(0, own_ns))
            if log.fast:
                self._settle_other(mark)
            if mark is not None and mark[0]:
                handed, cpu_handed = mark[0], 0
            if handed:
                t_end = clock()
                if log.fast:  # NOTE [ The fast path ] in attach/run.py
                    self._compute_wall_ns += log.settle()
                    handed, cpu_handed = log.handed, 0
                if cpu_handed:
                    self._compute_cpu_ns += time.process_time_ns() - cpu_handed
                    self._compute_cpu_wall_ns += t_end - handed
                self._compute_wall_ns += t_end - handed
                if self._comm is not None:
                    self._comm.fold(log, handed, t_end)
                log.end(handed, t_end)
            if depth:
                nv.pop()

    def _settle_other(self, mark: list[int] | None) -> None:
        """Write the fast steps of the pass that handed the last batch, if it is not the one
        whose ``mark`` this is (NOTE [ The fast path, by hand ]): before this pass's step
        begins, as they came; the last one's hand-over is that pass's to end."""
        owner = self._last_pass
        if owner is None or owner is mark:
            return
        self._compute_wall_ns += self._steps_log.settle()
        owner[0] = self._steps_log.handed

    # ---- GPU compute time (CUDA events) ------------------------------------------------------

    # NOTE [ GPU compute by events ]
    # An event at each hand-over and one at the next request bracket a step's GPU work; the
    # CPU clock is read right after each record. Where the GPU span is longer than the CPU's
    # between the same two records, the GPU ran on past the request, while the loop waited for
    # the next batch (or was held in copying it): that wait was GPU compute, and the analysis
    # moves it (analyze/loop.py: _gpu_shift). So a step's pair is counted with the group
    # (start-up or steady) of the step that follows it, whose wait it overlaps: the start-up
    # wait, before any kernel, stays wait. The last step of a pass has no step after it; its
    # pair counts with the steady steps (the group the next pass's steps after start-up join),
    # which may move up to one step's GPU time too much from their wait. Comparing with the
    # CPU's own span between the records, not the step's parts, leaves pipeprof's bookkeeping
    # between them out of the excess.

    def _gpu_mark(self, start: Any, end: bool, next_first: bool = False) -> Any:
        timer = self.timer
        if not timer.poll_cuda() or (end and start is None):
            return None
        event = timer._free.pop() if timer._free else timer._factory()  # read events, reused
        event.record()
        now = clock()
        if not end:
            return event, now
        self._gpu_events.append((start[0], event, next_first, now - start[1]))
        if len(self._gpu_events) >= 64:
            self._resolve_gpu(block=False)
        return None

    def _resolve_gpu(self, block: bool) -> None:
        keep = []
        rec = self._steps_log.record
        for pair in self._gpu_events:
            start, end, next_first, cpu_ns = pair
            if block or end.query():
                if block:
                    end.synchronize()
                ns = int(start.elapsed_time(end) * 1e6)
                self.timer._free += (start, end)
                rec.gpu_compute.add(ns)  # and by the next step's group, for the correction
                part = rec.first if next_first else rec.steady
                part.setdefault("gpu_compute", Stat()).add(ns)
                part.setdefault("gpu_cpu", Stat()).add(cpu_ns)
            else:
                keep.append(pair)
        self._gpu_events = keep

    # ---- samplers and streaming --------------------------------------------------------------

    def _maybe_start_nvml(self) -> None:
        if self._nvml is not None or not self.sample_hz or not self._running:
            return
        from pipeprof.collect.samplers import NvmlSampler

        self._nvml = NvmlSampler(
            hz=self.sample_hz, gpus=self._gpu_indices(), nvml=self._nvml_module
        )
        self._samplers.append(self._nvml.start())

    def _gpu_indices(self) -> list[int] | None:
        """NVML indices to sample: ``gpus``, else the device's (``cuda:1`` is the second GPU
        in ``CUDA_VISIBLE_DEVICES``), else a distributed rank's own GPU, else all."""
        if self.gpus is not None:
            return list(self.gpus)
        dev = str(self.device or "")  # torch's "cuda:1" or TensorFlow's "/GPU:1"
        match = re.fullmatch(r"(?:cuda|/?(?:device:)?GPU):(\d+)", dev, flags=re.IGNORECASE)
        index = ranks.visible_to_nvml(int(match.group(1))) if match else ranks.local_gpu()
        return None if index is None else [index]

    def _collect_samplers(self, samplers: list[Any] | None = None) -> None:
        from pipeprof.collect.samplers import HostSampler, NvmlSampler

        samplers = self._samplers if samplers is None else samplers
        for sampler in samplers:
            if isinstance(sampler, NvmlSampler):
                self.session.gpu = sampler.to_dict()
            elif isinstance(sampler, HostSampler):
                self.session.host = sampler.to_dict()
        if samplers:
            self.session.costs["sampler_ns"] = sum(s.cpu_ns for s in samplers)
            self.session.costs["sampler_first_ns"] = sum(s.first_ns for s in samplers)

    def _maybe_flush(self) -> None:
        # NVML starts once the first batch is in: DataLoader workers have forked by then.
        self._maybe_start_nvml()
        if not self.stream or time.monotonic() - self._last_flush < self.flush_s:
            return
        self._last_flush = time.monotonic()
        try:
            self.snapshot(self.stream)
        except OSError as exc:
            self._stream_failed_once(exc)

    # NOTE [ Snapshots ]
    # A snapshot is the session of a loop still running, saved so that a crash, a SIGKILL or the
    # OOM killer leaves what was measured (``stream=``; ``pipeprof run`` by default). It is
    # written on the training thread between two steps, so its cost is the loop's: it must not
    # grow with the run. The aggregates are fixed-size and the rings bounded; the spans (up to
    # SPAN_LIMIT, about 10 MB of JSON) are the part that grew: a snapshot keeps the latest
    # SNAPSHOT_SPANS (the loop's end writes them all). Measured: benchmarks/stream_cost.py.
    def snapshot(self, path: str, samplers: list[Any] | None = None,
                 note: str | None = None) -> None:  # fmt: skip
        """Save the session as it is now to ``path``, marked partial (NOTE [ Snapshots ]).

        The file keeps the latest ``SNAPSHOT_SPANS`` spans; the loop's end writes them all.

        Args:
            path: the file to write (JSON; replaced atomically, never left half written).
            samplers: the host and GPU samplers to read; None: this profiler's own.
            note: one more note, written in the file only (the session does not keep it);
                None: no note.

        Raises:
            OSError: ``path`` cannot be written.
        """
        s = self.session
        s.end_ns = clock()
        self._steps_log.fold()
        self._comm_meta()
        self._collect_samplers(samplers)
        if not s.overhead_ns:  # a snapshot says what a region costs, too
            s.overhead_ns = measure_overhead()
        was, s.interrupted = s.interrupted, True
        try:
            s.save(path, spans=SNAPSHOT_SPANS, note=note)
        finally:
            s.interrupted = was

    def _hang_snapshot(self) -> None:
        """A hang was recorded (NOTE [ Hangs ] in collect/torch/hangs.py): the report so far to
        ``stream``, or to what the owner (``pipeprof run``) asked for."""
        if self.on_hang is not None:
            self.on_hang()
        elif self.stream is not None:
            self.snapshot(self.stream)

    def _save_stream(self) -> None:
        """Save the session to ``stream`` (all of it: the loop is over). A write that fails
        (folder removed, disk full) warns once and leaves a note; it never raises into the loop
        or masks the loop's exception."""
        assert self.stream is not None
        if not self.session.overhead_ns:
            self.session.overhead_ns = measure_overhead()
        try:
            self.session.save(self.stream)
        except OSError as exc:
            self._stream_failed_once(exc)

    def _stream_failed_once(self, exc: OSError) -> None:
        if not self._stream_failed:
            self._stream_failed = True
            msg = (
                f"pipeprof could not write the stream file {self.stream} ({exc}); profiling "
                "goes on in memory: save the report at the end with report.save(path)"
            )
            warnings.warn(msg, RuntimeWarning, stacklevel=3)
            self.session.notes.append(msg)

    # ---- replay baseline ----------------------------------------------------------------------

    def replay(self, step: Callable[[Any], Any], repeats: int = 3) -> dict[str, Any]:
        """Run ``step(batch)`` on the cached batches (``Profiler(replay=N)``): compute alone.

        Args:
            step: called as ``step(batch)`` for each cached batch, one training step each (once
                more on the first batch beforehand, untimed, to warm up). It must not change
                your training: build it on a copy of the model and optimizer, or leave out
                ``optimizer.step()``.
            repeats: timed passes over the cached batches (CUDA synchronised after each, where
                torch has it); the median pass (the slower middle one for an even count) gives
                the rate.

        Returns:
            ``{"batches", "repeats", "compute_samples_per_s"}``: the compute-only samples/s,
            also stored for the report (``report["loop"]["replay"]``).

        Raises:
            RuntimeError: no batches are cached (the Profiler was made without ``replay=N``,
                or ``prof.wrap(loader)`` was not iterated yet).
        """
        if not self._cached:
            raise RuntimeError(
                "no cached batches: create the Profiler with replay=N (e.g. 8) "
                "and iterate prof.wrap(loader) first"
            )
        samples = sum(batch_size(b) for b in self._cached)
        step(self._cached[0])  # warm-up
        _sync()
        times = []
        for _ in range(repeats):
            t0 = clock()
            for b in self._cached:
                step(b)
            _sync()
            times.append(clock() - t0)
        best = sorted(times)[len(times) // 2]
        result = {
            "batches": len(self._cached),
            "repeats": repeats,
            "compute_samples_per_s": round(samples / (best / 1e9), 3),
        }
        self._steps_log.record.replay = result
        return result


def _check_writable(path: str | os.PathLike[str], what: str) -> None:
    """Refuse an output file that cannot be written, before any work is done."""
    try:
        check_writable(path)
    except OSError as exc:
        raise ValueError(
            f"{what}={str(path)!r} cannot be written ({exc.strerror or exc}): give a file path "
            "in a folder that exists and that you may write to"
        ) from None


def _sync() -> None:
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.synchronize()


def _check_stage_every(every: Any) -> None:
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ValueError(
            f"stage_every must be a whole number >= 1 (time the loader's stages in one batch in "
            f"that many; 1 times every batch), got {every!r}"
        )


def _check_batches(batches: int | None) -> None:
    if batches is None:
        return
    if isinstance(batches, bool) or not isinstance(batches, int):
        raise TypeError(f"batches must be a positive int or None, got {batches!r}")
    if batches <= 0:
        raise ValueError(f"batches must be at least 1, got {batches}; use None for a whole epoch")


def profile(
    loader: Any,
    *,
    batches: int | None = None,
    device: Any = None,
    nvtx: bool = False,
    stage_every: int = STAGE_EVERY,
) -> Report:
    """Iterate ``loader`` on its own and report its stages, its throughput and its verdict.

    The user's loader, dataset and transforms are not modified. Exceptions raised by the
    dataset, transforms or ``collate_fn`` propagate unchanged; Ctrl-C stops early and returns a
    report of what was measured (``report["interrupted"]`` is True).

    Args:
        loader: a ``torch.utils.data.DataLoader``, or a ``tf.data.Dataset`` (one batch is one
            element: docs/tfdata.md).
        batches: how many batches to take; None: one epoch.
        device: where each batch is moved, as a training loop would (``"cuda"``, a
            ``torch.device``); the copy is timed as ``transfer/h2d``.
        nvtx: also emit each stage (in the workers too), each wait and each copy as an NVTX
            range for Nsight Systems (docs/integrations.md).
        stage_every: time the stages in one batch in that many (a pass of 16 batches or more;
            1: every batch), as in ``Profiler``.

    Returns:
        The Report (``print`` it, ``render("html")``, ``save(path)``, ``to_dict()``).

    Raises:
        TypeError: ``loader`` is neither a DataLoader nor a tf.data.Dataset, or ``batches`` is
            not an int.
        ValueError: ``batches`` or ``stage_every`` is below 1, or the loader yields no batches.
    """
    _check_batches(batches)
    _check_stage_every(stage_every)
    if is_tf_dataset(loader):  # a tf.data.Dataset: traced with TensorFlow's profiler
        from pipeprof.collect.tf.dataset import profile_dataset

        tf_session = profile_dataset(loader, batches, device)
        if nvtx:
            tf_session.notes.append(
                "nvtx=True: tf.data stages are read from TensorFlow's trace after the run, so "
                "pipeprof emits no NVTX ranges for them"
            )
        return Report(tf_session)
    if not is_torch_loader(loader):
        raise TypeError(
            f"pipeprof.profile() needs a torch.utils.data.DataLoader (or a tf.data.Dataset), got "
            f"{type(loader).__name__}; "
            "wrap a dataset first: DataLoader(dataset, batch_size=..., num_workers=...)"
        )
    _check_not_empty(loader)
    from pipeprof.collect.torch.loader import ProfiledLoader

    session = Session(framework="torch", mode="loader")
    nv = None
    if nvtx:
        from pipeprof.collect import ranges

        nv = ranges.open_ranges(session.notes)
    if nv is not None:
        ranges.install()
    try:
        twin = ProfiledLoader(loader, session, device, nv, batches, stage_every)
        run_alone(twin, session, batches)
    finally:
        if nv is not None:
            ranges.uninstall()
    session.settle_counted()
    session.overhead_ns = measure_overhead()  # after the run: calibrating is not its time
    session.meta["core_scaling"] = core_scaling()
    if session.batches == 0 and not session.interrupted:
        raise ValueError(
            "the loader yielded no batches: is its dataset empty, or is drop_last=True "
            "with fewer samples than batch_size?"
        )
    return Report(session)


def _check_not_empty(loader: Any) -> None:
    try:
        n = len(loader)
    except Exception:  # an IterableDataset without a (working) __len__: find out by iterating
        return
    if n == 0:
        raise ValueError(
            f"the DataLoader has no batches (len(dataset)={_len(loader.dataset)}, "
            f"batch_size={loader.batch_size}, drop_last={loader.drop_last}): give it data"
        )


def _len(dataset: Any) -> str:
    try:
        return str(len(dataset))
    except Exception:
        return "unknown"
