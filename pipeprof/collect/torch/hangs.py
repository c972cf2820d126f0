"""A loop that waits for a batch far longer than it ever has: where each worker is, recorded
while the job goes on (docs/findings.md#loop-hang).

NOTE [ Hangs ]
A watch for each pass of a profiled DataLoader (it holds the loader weakly, and is dropped as
the pass ends) is looked at every POLL_S by the process's one watchdog thread (a daemon,
``Watcher``, started once before the loop: a thread's start costs the pass's ``iter()`` 1-8 ms
on 2 busy cores). It reads the loader's count of batches. The longest gap
between two batches it has seen (after the pass's first: the workers' start-up) sets the
threshold: a gap
HANG_FACTOR times as long, and at least ``hang_s`` (60 s unless the user says:
``Profiler(hang_s=)``, ``pipeprof run --hang-s``; 0 turns it off; a gap is seen at POLL_S's
grain, so 10 times it at least). A gap past it counts only
while the training thread is inside this loader's fetch (a frame of torch's ``_next_data`` on
its stack, of this pass's iterator): a loop busy elsewhere (validation, a checkpoint) is not
waiting for data. Then, once per stall:

1. Which worker the loop waits for: torch's iterator holds the batch index it waits for
   (``_rcvd_idx``) and the worker it gave that batch to (``_task_info``); that worker has been
   on the batch at least as long as the loop has waited.
2. For each worker: its state and kernel wait channel (``/proc/PID/stat``, ``/proc/PID/wchan``,
   read from outside), and its Python stack. Each worker registered ``faulthandler`` for
   STACK_SIGNAL as it started (``ready_stacks``, in ``WorkerInit``), writing to a file of its
   own; the watchdog signals the workers whose file exists (only those registered: the signal's
   default action would end a process that did not) and reads what they wrote. faulthandler's
   handler is async-signal-safe and written in C: it dumps a worker stuck in a system call or in
   C code, and the call goes on after it (PEP 475 retries an interrupted sleep or read). Without
   workers the training thread's own stack is read (``sys._current_frames``).
3. The stage each stack is in, from pipeprof's own frames on it (``_stage_spans``: its dataset
   wrappers are ``load``, its collate wrapper ``collate``, its worker init ``worker_init_fn``;
   ``idle`` where torch's worker loop waits for a task), and the innermost frame of the user's
   code. A forked worker's frames from torch's worker loop out are the parent's: cut. A worker
   with no stack file has not reached pipeprof's worker init: ``starting`` (importing, or
   unpickling the dataset under spawn; a threshold shorter than the workers' start-up is met
   at the pass's first batch).

The record goes to ``meta["hang"]`` (the first stall of the profile; ``resumed_s``, about how
long the loop waited in all, once the batch came after all), a line to stderr, and the owner's
``on_hang`` (a snapshot of the report so far: ``stream=``, ``pipeprof run``'s ``--out``).
Nothing of it runs in the loop's own thread.
"""

from __future__ import annotations

import atexit
import faulthandler
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import weakref
from typing import Any

from pipeprof.core.units import stage_words

HANG_FACTOR = 10.0  # ... and this many times the longest gap seen before it
POLL_S = 0.5  # how often the watchdog looks
RESUME_POLL_S = 0.05  # ... and once it has recorded a hang, to see when the batch comes
DUMP_WAIT_S = 0.5  # how long the workers have to write their stacks
STACK_LINES = 40  # a stack's lines kept, innermost first
_SIGRTMIN = getattr(signal, "SIGRTMIN", None)
STACK_SIGNAL = _SIGRTMIN + 7 if _SIGRTMIN is not None else None
_KEPT: list[Any] = []  # the stack files the workers keep open for faulthandler


def stack_file(folder: str, pid: int) -> str:
    return os.path.join(folder, f"stack-{pid}.txt")


def ready_stacks(folder: str | None) -> None:
    """In a worker as it starts: dump its threads' stacks to its own file on STACK_SIGNAL
    (NOTE [ Hangs ], step 2). The file exists only once the handler is in place."""
    if folder is None or STACK_SIGNAL is None:
        return
    try:
        f = open(stack_file(folder, os.getpid()) + ".tmp", "w")  # noqa: SIM115 (kept open)
        faulthandler.register(STACK_SIGNAL, file=f, all_threads=True, chain=False)
        os.rename(f.name, stack_file(folder, os.getpid()))
        _KEPT.append(f)
    except (OSError, ValueError, RuntimeError):  # no stacks from this worker: the rest holds
        pass


class Watchdog:
    """One pass's watch (NOTE [ Hangs ]), looked at by the process's watcher thread. ``owner`` is
    the ProfiledLoader: ``seen``, ``passes``, ``current()`` (the pass's torch iterator),
    ``thread_id`` (the training thread), ``session`` and ``on_hang``."""

    def __init__(self, owner: Any, hang_s: float, folder: str | None) -> None:
        self.owner = weakref.ref(owner)
        self.hang_s = hang_s
        self.folder = folder
        self.longest = 0.0
        self.reported = False
        self.stopped = False
        self.last, self.since = owner.seen, time.monotonic()  # the pass's start: no batch yet
        self.begun = False  # its first batch came (the gap before it is the workers' start-up)
        self.due = self.since + POLL_S
        _WATCHER.add(self)

    def stop(self) -> None:
        """The pass is over: the watcher looks at it no more."""
        self.stopped = True
        _WATCHER.discard(self)

    def poll(self, now: float) -> None:
        """One look at the pass (on the watcher's thread); the next is due a poll later."""
        self.due = now + (RESUME_POLL_S if self.reported else POLL_S)
        try:
            self._look(now)
        except Exception as exc:  # the watchdog never breaks the job: it stops, and says so
            self.stop()
            owner = self.owner()
            if owner is not None:
                owner.session.notes.append(f"pipeprof: the hang watchdog stopped ({exc!r})")

    def _look(self, now: float) -> None:
        owner = self.owner()
        if owner is None:
            self.stop()
            return
        if owner.seen != self.last:
            if self.begun:
                self.longest = max(self.longest, now - self.since)
            if self.reported:
                hang = owner.session.meta.get("hang")
                if hang is not None and hang.get("resumed_s") is None:
                    hang["resumed_s"] = round(now - self.since, 3)
            self.last, self.since, self.begun, self.reported = owner.seen, now, True, False
            return
        stalled = now - self.since
        if self.reported or stalled < max(self.hang_s, HANG_FACTOR * self.longest):
            return
        it = owner.current()
        if it is None:
            return
        if not _in_fetch(owner.thread_id, it):
            self._stalled(owner, stalled, self.since)
            return
        try:
            record = self._record(owner, it, stalled, self.last)
        except Exception as exc:  # the watchdog never breaks the job
            self.reported = True
            owner.session.notes.append(f"pipeprof: the hang could not be recorded ({exc!r})")
            return
        if record is None:  # the batch came as it was being recorded: no hang
            return
        self.reported = True
        record["last_batch_unix"] = round(time.time() - (time.monotonic() - self.since), 3)
        owner.session.meta.setdefault("hang", record)
        if owner.on_hang is not None:  # the snapshot first: the line says it is there
            try:
                owner.on_hang()
            except Exception as exc:
                owner.session.notes.append(f"pipeprof: the hang's snapshot failed ({exc!r})")
        print(_line(record), file=sys.stderr, flush=True)

    def _stalled(self, owner: Any, stalled: float, since: float) -> None:
        """No batch for as long, the training thread elsewhere than the fetch: where it is, kept
        up to date while it lasts (NOTE [ Hangs ], ranks). No finding of its own: a loop may be
        busy (validation, a checkpoint); the job report compares the ranks'."""
        meta = owner.session.meta
        got = meta.get("stall")
        if got is not None and got["batches"] == owner.seen:
            got["stalled_s"] = round(stalled, 3)
            return
        if got is not None:
            return  # the first stall of the profile is kept
        frame = sys._current_frames().get(owner.thread_id)
        text = _frames_text(frame)
        meta["stall"] = {
            "stalled_s": round(stalled, 3),
            "batches": owner.seen,
            "last_batch_unix": round(time.time() - (time.monotonic() - since), 3),
            "in": _kind([_parse(line) for line in text]),
            **_where(text),
        }
        if owner.on_hang is not None:  # a job killed while it lasts leaves it
            try:
                owner.on_hang()
            except Exception as exc:
                meta.setdefault("stall_note", f"the stall's snapshot failed ({exc!r})")

    def _record(self, owner: Any, it: Any, stalled: float, last: int) -> dict[str, Any] | None:
        """The hang's record; None where the loop got its batch meanwhile (``seen`` moved on
        from ``last`` while the batch and its worker were read: the stall ended)."""
        waits_on = _waited_worker(it)
        batch = getattr(it, "_rcvd_idx", getattr(it, "_num_yielded", None))
        if owner.seen != last:
            return None
        workers = []
        pids = [w.pid for w in getattr(it, "_workers", [])]
        stacks = _dump(self.folder, pids) if pids else {}
        for wid, pid in enumerate(pids):
            where = _where(stacks.get(pid))
            if pid not in stacks and not _started(self.folder, pid):
                where["stage"] = "starting"
            workers.append(
                {
                    "id": wid,
                    "pid": pid,
                    "waited_for": wid == waits_on,
                    **_proc_state(pid),
                    **where,
                }
            )
        record: dict[str, Any] = {
            "waited_s": round(stalled, 3),
            "threshold_s": round(max(self.hang_s, HANG_FACTOR * self.longest), 3),
            "longest_before_s": round(self.longest, 3),
            "batch": batch,
            "worker": waits_on,
            "workers": workers,
            "resumed_s": None,
        }
        if not pids:  # num_workers=0: the training thread reads the data itself
            frame = sys._current_frames().get(owner.thread_id)
            record["main"] = _where(_frames_text(frame))
        return record


def _in_fetch(thread_id: int | None, it: Any) -> bool:
    """Whether the training thread is inside torch's ``_next_data`` of the iterator ``it``."""
    frame = sys._current_frames().get(thread_id) if thread_id is not None else None
    while frame is not None:
        if frame.f_code.co_name == "_next_data" and "torch/utils/data" in frame.f_code.co_filename:
            return frame.f_locals.get("self") is it
        frame = frame.f_back
    return False


def _kind(frames: list[tuple[str, int, str]]) -> str:
    """What a stalled training thread is in: a collective of torch.distributed, a backward pass
    (where DDP waits for its all-reduce), or the script's own code."""
    paths = [f[0].replace(os.sep, "/") for f in frames]
    if any("torch/distributed/" in p for p in paths):
        return "collective"
    if any("torch/autograd/" in p or p.endswith("torch/_tensor.py") for p in paths):
        return "backward"
    return "code"


def _waited_worker(it: Any) -> int | None:
    """The worker torch gave the batch the loop waits for (NOTE [ Hangs ], step 1)."""
    info = getattr(it, "_task_info", None)
    idx = getattr(it, "_rcvd_idx", None)
    got = info.get(idx) if isinstance(info, dict) else None
    return int(got[0]) if got else None


def _started(folder: str | None, pid: int) -> bool:
    """Whether worker ``pid`` reached pipeprof's worker init, which registers its stack file
    (``ready_stacks``); True where that cannot be told. A worker that has not is still
    starting: importing, or unpickling the dataset (spawn, forkserver)."""
    if folder is None or STACK_SIGNAL is None:
        return True
    return os.path.exists(stack_file(folder, pid))


def _dump(folder: str | None, pids: list[int]) -> dict[int, list[str]]:
    """Each registered worker's stacks, read from its file after STACK_SIGNAL."""
    if folder is None or STACK_SIGNAL is None:
        return {}
    sizes = {}
    for pid in pids:
        path = stack_file(folder, pid)
        if os.path.exists(path):
            sizes[pid] = os.path.getsize(path)
            try:
                os.kill(pid, STACK_SIGNAL)
            except OSError:
                sizes.pop(pid)
    time.sleep(DUMP_WAIT_S)
    got = {}
    for pid, start in sizes.items():
        with open(stack_file(folder, pid)) as f:
            f.seek(start)
            got[pid] = f.read().splitlines()
    return got


def _proc_state(pid: int) -> dict[str, Any]:
    """A process's state letter and kernel wait channel, read from /proc; None where not."""
    state = wchan = None
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        with open(f"/proc/{pid}/wchan") as f:
            wchan = f.read().strip() or None
    except (OSError, IndexError):
        pass
    return {"state": state, "wchan": None if wchan == "0" else wchan}


def _frames_text(frame: Any) -> list[str]:
    """A frame's stack in faulthandler's words, innermost first."""
    lines = []
    while frame is not None:
        code = frame.f_code
        lines.append(f'  File "{code.co_filename}", line {frame.f_lineno} in {code.co_name}')
        frame = frame.f_back
    return lines


def _where(stack: list[str] | None) -> dict[str, Any]:
    """The stage a worker's stack is in, the innermost frame of the user's code, and the stack
    (its thread that runs pipeprof's or torch's frames, innermost first) (NOTE [ Hangs ], 3)."""
    if not stack:
        return {"stage": None, "at": None, "stack": []}
    frames = [_parse(line) for line in stack if line.strip().startswith("File ")]
    threads = _threads(stack) or [frames]
    # the thread that reads the data: pipeprof's frames on it, or torch's worker loop; its
    # frames from the worker loop out are the parent's at the fork, not the worker's
    main = next((t for t in threads if any(_ours(f) for f in t)), None) or next(
        (t for t in threads if any(f[2] == "_worker_loop" for f in t)), threads[-1]
    )
    loop = next((i for i, f in enumerate(main) if f[2] == "_worker_loop"), None)
    if loop is not None:
        main = main[: loop + 1]
    stage = next((s for f in main if (s := _stage(f)) is not None), None)
    if stage is None and loop is not None and loop >= 1 and main[loop - 1][2] == "get":
        stage = "idle"  # torch's worker loop waits for its next task
    user = next((f for f in main if not (_ours(f) or _torchs(f) or _library(f))), None)
    at = f"{user[2]} ({os.path.basename(user[0])}:{user[1]})" if user else None
    inner = main[0] if main else None
    if inner is not None and user is not None and inner is not user:
        at = f"{at}, in {inner[2]} ({os.path.basename(inner[0])}:{inner[1]})"
    text = [f"{os.path.basename(f[0])}:{f[1]} in {f[2]}" for f in main[:STACK_LINES]]
    return {"stage": stage, "at": at, "stack": text}


def _threads(stack: list[str]) -> list[list[tuple[str, int, str]]]:
    got: list[list[tuple[str, int, str]]] = []
    for line in stack:
        if line.startswith(("Thread ", "Current thread ")):
            got.append([])
        elif line.strip().startswith("File ") and got:
            got[-1].append(_parse(line))
    return [t for t in got if t]


def _parse(line: str) -> tuple[str, int, str]:
    """``File "path", line N in name`` as (path, N, name)."""
    rest = line.strip()[len('File "') :]
    path, _, tail = rest.partition('", line ')
    number, _, name = tail.partition(" in ")
    return path, int(number) if number.isdigit() else 0, name.strip()


_PIPEPROF = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_SPANS: list[tuple[str, int, int, str]] = []  # (file, first line, last line, stage)


def _stage_spans() -> list[tuple[str, int, int, str]]:
    """Where pipeprof's wrappers' code lies, and the stage each runs (NOTE [ Hangs ], step 3)."""
    if not _SPANS:
        from pipeprof.collect.torch import dataset, loader

        for fn, stage in (
            (loader.MapDataset.__getitem__, "load"),
            (loader.MapDataset.__getitems__, "load"),
            (loader.MapDatasetItems.__getitems__, "load"),
            (loader.IterDataset._timed, "load"),
            (loader.TimedState.__next__, "load"),
            (loader.Collate.__call__, "collate"),
            (loader.WorkerInit.__call__, "worker_init_fn"),
            (dataset.TimedChain.__call__, "transform"),
            (dataset.SplitLoader.__call__, "load"),
            (dataset.TimedLoader.__call__, "load"),
        ):
            code = fn.__code__
            lines = [n for _, _, n in code.co_lines() if n is not None]
            _SPANS.append((code.co_filename, min(lines), max(lines), stage))
    return _SPANS


def _ours(f: tuple[str, int, str]) -> bool:
    return f[0].startswith(_PIPEPROF + os.sep)


def _torchs(f: tuple[str, int, str]) -> bool:
    return f"{os.sep}torch{os.sep}" in f[0] or f"{os.sep}multiprocessing{os.sep}" in f[0]


def _library(f: tuple[str, int, str]) -> bool:
    """The standard library and installed packages: not the user's own code."""
    return "site-packages" in f[0] or f[0].startswith((sys.base_prefix, "<frozen"))


def _stage(f: tuple[str, int, str]) -> str | None:
    if not _ours(f):
        return None
    return next((s for path, a, b, s in _stage_spans() if path == f[0] and a <= f[1] <= b), None)


def _line(record: dict[str, Any]) -> str:
    """The stderr line for a hang (NOTE [ Hangs ])."""
    head = (f"pipeprof: the loop has waited {record['waited_s']:.0f} s for batch "
            f"{record['batch']} (the longest gap before: "
            f"{record['longest_before_s']:.2g} s)")  # fmt: skip
    worker = next((w for w in record["workers"] if w["waited_for"]), None)
    if worker is not None:
        head += (f"; worker {worker['id']} (pid {worker['pid']}) has it, "
                 f"{stage_words(worker['stage'])}"
                 + (f" at {worker['at']}" if worker["at"] else ""))  # fmt: skip
    elif record.get("main"):
        at = record["main"]["at"]
        return f"{head}; the training process reads it, at {at} (the report has its stack)"
    return head + " (the report has every worker's stack)"


class Watcher:
    """The process's one watchdog thread (NOTE [ Hangs ]): it looks at each pass's watch when
    that is due. Started once, out of the loop (``ready``); a pass's start and end only add and
    remove its watch."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watches: list[Watchdog] = []
        self._thread: threading.Thread | None = None

    def ready(self) -> None:
        """The thread runs in this process."""
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            self._thread = threading.Thread(target=self._run, name="pipeprof-hangs", daemon=True)
            self._thread.start()

    def forked(self) -> None:
        """In a forked child: none of its parent's watches, nor its thread, came along."""
        self._lock = threading.Lock()
        self._watches = []
        self._thread = None

    def add(self, watch: Watchdog) -> None:
        self.ready()
        with self._lock:
            self._watches.append(watch)

    def discard(self, watch: Watchdog) -> None:
        with self._lock:
            if watch in self._watches:
                self._watches.remove(watch)

    def watching(self) -> list[Watchdog]:
        """The passes watched now."""
        with self._lock:
            return list(self._watches)

    def _run(self) -> None:
        while True:
            with self._lock:
                watches = list(self._watches)
            now = time.monotonic()
            for watch in watches:
                if not watch.stopped and watch.due <= now:
                    watch.poll(now)
            due = min((w.due for w in watches if not w.stopped), default=now + POLL_S)
            time.sleep(min(POLL_S, max(0.0, due - time.monotonic())) or 0.001)


_WATCHER = Watcher()
os.register_at_fork(after_in_child=_WATCHER.forked)


_STACKS: list[str] = []  # the process's folder for the workers' stack files


def stack_folder() -> str:
    """The folder the workers' stack files go to: one a process, removed at its exit."""
    if not _STACKS:
        folder = tempfile.mkdtemp(prefix="pipeprof-stacks-")
        atexit.register(shutil.rmtree, folder, True)
        _STACKS.append(folder)
    return _STACKS[0]


def watching() -> list[Watchdog]:
    """The passes the watcher looks at now."""
    return _WATCHER.watching()


def ready(hang_s: float | None) -> None:
    """The watcher's thread started, and the stacks' folder made, ahead of the loop where hangs
    are watched: a pass's ``iter()`` then does neither (NOTE [ Hangs ])."""
    if hang_s:
        _WATCHER.ready()
        stack_folder()


def watch(owner: Any, hang_s: float | None, folder: str | None) -> Watchdog | None:
    """A watch of ``owner``'s pass (NOTE [ Hangs ]); None where hangs are not watched."""
    if not hang_s:
        return None
    return Watchdog(owner, float(hang_s), folder)
