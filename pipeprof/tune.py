"""``pipeprof tune``: try the fixes for real, keep what works (docs/tune.md).

A baseline profile (``pipeprof run --batches N --end-script``) names the loader to tune and the
settings to try first; then each setting is a trial, a fresh run of the script with it applied
where the script makes that loader (attach/trial.py), in rounds (NOTE [ Tuning ] in
analyze/tune.py). The result is a table of what each setting measured against what the profile
promised, the chosen setting with its gain, and the edit of the script's ``DataLoader(...)``
call that makes it (attach/edit.py), written with ``apply``.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeprof.analyze import tune as choose
from pipeprof.analyze.scenarios import worker_rows
from pipeprof.attach import edit

SCHEMA = "pipeprof-tune/1"
TAIL = 2000  # characters of a failed run's stderr kept in the result


class TuneError(RuntimeError):
    """The tune cannot go on (the script fails on its own, no loader was profiled)."""


def _run(cmd: list[str], timeout: float, env: dict[str, str] | None = None,
         cwd: str | None = None) -> tuple[int | None, str]:
    """A child run of the script in its own process group (its workers too), killed whole at
    ``timeout``; returns its exit status (None: timed out) and the tail of its stderr."""
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env, cwd=cwd,
                                start_new_session=True)  # fmt: skip
        try:
            rc: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = None
        except BaseException:  # Ctrl-C: the child goes with us
            _kill(proc)
            raise
        if rc is None:
            _kill(proc)
        else:  # the script is over; a worker left behind is not ours to keep
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        err.seek(0)
        tail = err.read().decode("utf-8", "replace")[-TAIL:]
    return rc, tail


def _kill(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()
    proc.wait()


class Ledger:
    """The trials' rates, the paired rounds they ran in, and what those say: which setting beat
    which, and the one to choose (NOTE [ Tuning ]).

    Args:
        rounds: the rounds the tune runs a phase for (a setting is kept on as many as 2 of them).
    """

    def __init__(self, rounds: int) -> None:
        self.rounds = rounds
        self.rates: dict[str, list[float]] = {}  # each setting's measured samples/s, in order
        self.log: list[dict[str, float]] = []  # each round's rates, by setting
        self.failed: dict[str, str] = {}
        self.stopped: set[str] = set()  # dropped as clearly worse
        self.lost: set[str] = set()  # lost a paired round to the setting it had to beat
        self.refs: dict[str, str] = {}  # the best so far each later phase's settings ran beside

    def prune(self, names: list[str], base: str, ref: str) -> None:
        """After a round of ``names``: those clearly behind the others are dropped, and those
        that lost the round to ``ref`` (the setting they had to beat) stop there."""
        alive = {n: self.rates.get(n, []) for n in names if n not in self.failed}
        self.stopped |= choose.dropped(alive, keep={base, ref})
        got = self.log[-1]
        lost = {n for n in got if n not in (base, ref) and ref in got and got[n] <= got[ref]}
        self.lost |= lost
        self.stopped |= lost

    def left(self, names: list[str]) -> list[str]:
        """``names`` not failed nor stopped."""
        return [n for n in names if n not in self.failed and n not in self.stopped]

    def won(self, name: str, other: str) -> bool:
        """Whether ``name`` beat ``other`` in as many paired rounds as the tune runs, up to 2:
        a knob dropped after one round (clearly behind another knob) is not kept on that round
        alone, unless the tune runs one round."""
        g = self.vs(name, other)
        return choose.beats(g) and g is not None and g["rounds"] >= min(2, self.rounds)

    def vs(self, name: str, other: str) -> dict[str, Any] | None:
        """``name``'s gain over ``other`` from the rounds that ran both."""
        return choose.gain([(r[name], r[other]) for r in self.log if name in r and other in r])

    def gain(self, name: str, base: str) -> dict[str, Any] | None:
        """``name``'s gain over the script's own settings: from the rounds that ran both, or
        chained through the best so far it ran beside in a later phase (NOTE [ Tuning ])."""
        via = self.refs.get(name)
        if via is None:
            return self.vs(name, base)
        return choose.chain(self.vs(name, via), self.gain(via, base), via)

    def best(self, base: str) -> str:
        """The setting with the best gain, where it beat the script's own settings; else the
        script's own."""
        gains = {n: self.gain(n, base) for n in self.rates
                 if n != base and n not in self.failed and n not in self.lost}  # fmt: skip
        for name, g in sorted(gains.items(), key=lambda x: (x[1] or {}).get("ratio", 0.0),
                              reverse=True):  # fmt: skip
            if g is None or g["ratio"] <= 1.0:
                return base  # the rest ranked under the script's own
            if choose.beats(g):
                return name
        return base


class Tuner:
    """One tune of one script: the baseline, the trials, the choice."""

    def __init__(self, target: str, args: list[str], *, module: bool = False, batches: int = 60,
                 warmup: int = 5, rounds: int = 3, budget_s: float = 600.0,
                 tries: list[dict[str, Any]] | None = None, workdir: str | None = None,
                 progress: Callable[[str, int, int], None] | None = None,
                 prune: bool = True, ladder: bool = True,
                 knobs: set[str] | None = None) -> None:  # fmt: skip
        if batches <= warmup + 1:
            raise ValueError(f"--batches must exceed the {warmup} warm-up batches by 2 or more")
        self.target, self.args, self.module = target, args, module
        self.batches, self.warmup, self.rounds = batches, warmup, rounds
        self.budget_s = budget_s
        self.prune = prune  # drop clearly worse settings, stop trials halfway (not: every run)
        self.ladder = ladder  # the ceiling ladder's runs after the choice
        self.knobs = set(choose.KNOBS) if knobs is None else knobs  # those it may change
        self.tries = tries or []
        self.own_dir = workdir is None  # removed by close()
        self.dir = workdir or tempfile.mkdtemp(prefix="pipeprof-tune-")
        self.progress = progress or (lambda what, done, total: None)
        self.t0 = time.monotonic()
        self.trial_s: list[float] = []  # each finished trial's wall time
        self.runs: dict[str, list[dict[str, Any]]] = {}  # each trial's result, in order
        self.settings: dict[str, dict[str, Any]] = {}
        self.ledger = Ledger(rounds)  # the trials' rates and rounds, and what they say
        self.notes: list[str] = []
        self.done = 0  # trials run
        self.planned = 0  # trials planned (the progress bar's total)
        self.baseline_s = 60.0  # the baseline profile's wall time, once it ran
        self.out_of_budget = False

    def close(self) -> None:
        """Remove the trials' files (specs, results), where the tune made their folder."""
        if self.own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    # ---- running -------------------------------------------------------------------------

    def _script(self) -> list[str]:
        return ["-m", self.target, *self.args] if self.module else [self.target, *self.args]

    def spent(self) -> float:
        return time.monotonic() - self.t0

    def typical(self) -> float:
        """The longest trial so far (the baseline's time before any): what the next may take."""
        return max(self.trial_s, default=self.baseline_s)

    def baseline(self) -> dict[str, Any]:
        """Profile the script as it is, for ``batches`` batches, and read its report."""
        out = os.path.join(self.dir, "baseline.json")
        cmd = [sys.executable, "-m", "pipeprof", "run", "--batches", str(self.batches),
               "--end-script", "-q", "--snapshot-s", "0", "--hang-s", "0", "-o", out,
               *self._script()]  # fmt: skip
        self.progress("profiling the script as it is", 0, 0)
        t = time.monotonic()
        rc, tail = _run(cmd, timeout=max(self.budget_s, 60.0))
        self.baseline_s = time.monotonic() - t
        report: dict[str, Any] = {}
        if os.path.exists(out):
            with open(out, encoding="utf-8") as f:
                report = json.load(f)
        elif rc != 0:
            why = "timed out" if rc is None else f"exit status {rc}"
            raise TuneError(f"the script failed before a batch was profiled ({why}):\n{tail}")
        site = (report.get("meta") or {}).get("run_loader", {}).get("site")
        if not site or report.get("mode") != "loop":
            raise TuneError("pipeprof run profiled no training loop over a DataLoader in the "
                            "script: pipeprof tune tunes a torch DataLoader's loop "
                            "(docs/tune.md)")  # fmt: skip
        if rc not in (0, None):
            raise TuneError(f"the script failed on its own (exit status {rc}):\n{tail}")
        return report

    def trial(self, name: str, floor: float | None) -> dict[str, Any]:
        """One run of the script with setting ``name`` applied; recorded, never fatal."""
        settings = {k: v for k, v in self.settings[name].items() if k != "_mode"}
        mode = self.settings[name].get("_mode")
        k = len(self.runs.setdefault(name, []))
        out = os.path.join(self.dir, f"trial-{sum(map(len, self.runs.values()))}-{k}.json")
        spec = {"site": self.site, "settings": settings, "batches": self.batches,
                "warmup": self.warmup, "floor": floor, "out": out, "mode": mode}  # fmt: skip
        path = out + ".spec"
        with open(path, "w", encoding="utf-8") as f:
            json.dump(spec, f)
        env = dict(os.environ)
        left = self.budget_s - self.spent()
        timeout = max(10.0, min(left, 4 * self.typical() + 30))
        cmd = [sys.executable, "-m", "pipeprof.attach.trial", path, *self._script()]
        t = time.monotonic()
        rc, tail = _run(cmd, timeout=timeout, env=env)
        wall = time.monotonic() - t
        result: dict[str, Any] = {"rc": rc, "wall_s": round(wall, 3)}
        if os.path.exists(out):
            with open(out, encoding="utf-8") as f:
                result.update(json.load(f))
        if rc is None and result.get("ended") in ("done", "stopped early"):
            pass  # measured, then slow to end (a thread of the script's own): the figure holds
        elif rc is None:
            result["ended"], result["error"] = "timed out", f"no result within {timeout:.0f} s"
        elif rc == 0 and result.get("ended") == "script ended" and not result["samples_per_s"]:
            result["error"] = (f"the script ended after {result.get('batches')} batches, too few "
                               f"to measure past the {self.warmup} of the warm-up")  # fmt: skip
        elif rc != 0 or result.get("samples_per_s") is None:
            why = result.get("error") or _last_line(tail) or f"exit status {rc}"
            if rc is not None and rc < 0:
                why = f"killed by signal {-rc}" + (" (out of memory?)" if rc == -9 else "")
            result["ended"], result["error"] = result.get("ended") or "failed", why
        self.runs[name].append(result)
        if result.get("error"):
            self.ledger.failed[name] = result["error"]
        else:
            self.trial_s.append(wall)
            self.ledger.rates.setdefault(name, []).append(result["samples_per_s"])
        return result

    def round(self, names: list[str], seed: int, base: str, ref: str) -> None:
        """Each setting still in, once, in a shuffled order; the round's rates are logged
        together, so that each setting is compared with the others in the rounds they shared."""
        order = names[:]
        random.Random(seed).shuffle(order)
        got: dict[str, float] = {}
        self.ledger.log.append(got)  # filled as the round runs: a round cut short still pairs
        for name in order:
            if name not in self.ledger.left([name]):
                continue
            if self.spent() + self.typical() > self.budget_s:
                self.out_of_budget = True
                return
            top = choose.leader(self.ledger.rates)
            floor = choose.FLOOR * choose.median(self.ledger.rates[top]) if top else None  # type: ignore[operator]
            self.progress(choose.key(self.settings[name]), self.done, self.planned)
            result = self.trial(name, floor if name not in (base, ref) and self.prune else None)
            self.done += 1
            if result.get("error") is None:
                got[name] = result["samples_per_s"]
                if result.get("ended") == "stopped early":
                    self.ledger.stopped.add(name)

    def phase(self, names: list[str], base: str, seed: int, ref: str | None = None) -> None:
        """``rounds`` rounds of ``names``, each of which has to beat ``ref`` (the script's own
        settings, else the best so far) in every round that ran both to be chosen (NOTE
        [ Tuning ]): one that lost a round to it stops there."""
        ref = ref or base
        for n in names:  # its gain over the script: through ref's (NOTE [ Tuning ])
            if ref != base and n not in (base, ref) and n not in self.runs:
                self.ledger.refs.setdefault(n, ref)
        rounds = self.rounds if ref == base else self.later_rounds()
        self.planned += rounds * len(names)
        for r in range(rounds):
            self.round(names, seed + r, base, ref)
            if self.out_of_budget:
                return
            if self.prune:
                self.ledger.prune(names, base, ref)
            left = self.ledger.left(names)
            self.planned -= (rounds - r - 1) * (len(names) - len(left))
            names = left
            if len(names) <= 1:
                return

    def later_rounds(self) -> int:
        """A later phase's rounds (NOTE [ Tuning ]): one fewer than the first's, 2 at least
        (what keeping a setting takes: ``Ledger.won``), never more than the first's."""
        return min(self.rounds, max(2, self.rounds - 1))

    def add(self, settings: dict[str, Any]) -> str:
        name = choose.key(settings)
        self.settings.setdefault(name, settings)
        return name

    # ---- the tune --------------------------------------------------------------------------

    def tune(self) -> dict[str, Any]:
        """Baseline, worker counts, then the other knobs at the best count (NOTE [ Tuning ]).
        Ctrl-C ends it with what was measured until then (``interrupted`` in the result)."""
        report = self.baseline()
        meta = report.get("meta") or {}
        self.site = meta["run_loader"]["site"]
        cores = int((report.get("host") or {}).get("cpu_count") or os.cpu_count() or 1)
        base = self.add({})
        rows = worker_rows(report, cores, list(range(1, choose.most_workers(cores) + 1)))
        counts = choose.worker_counts(report, cores, rows) if "num_workers" in self.knobs else []
        interrupted = False
        try:
            self.search(report, base, counts, cores, rows)
        except KeyboardInterrupt:
            interrupted = True
            self.notes.append(f"interrupted after {self.done} trials: the choice rests on those")
        if self.out_of_budget:
            self.notes.append(f"the budget ({self.budget_s:.0f} s) ran out after {self.done} "
                              "trials: the choice rests on those")  # fmt: skip
        best = self.ledger.best(base)
        result = self._result(report, rows, base, best)
        result["interrupted"] = interrupted
        result["search_s"] = round(self.spent(), 1)  # to the choice: the ladder's runs follow
        if self.ladder and not (self.out_of_budget or interrupted):
            try:
                result["ladder"] = self.climb(report, base, best)
            except KeyboardInterrupt:
                result["interrupted"] = True
        result["spent_s"] = round(self.spent(), 1)
        return result

    def search(self, report: dict[str, Any], base: str, counts: list[int], cores: int,
               rows: list[dict[str, Any]]) -> None:
        workers = choose.current(report)["num_workers"]
        names = [base] + [self.add({"num_workers": k}) for k in counts if k != workers]
        names += [n for n in (self.add(t) for t in self.tries) if n not in names]
        self.phase(names, base, seed=1)
        best = self.ledger.best(base)
        at = self.settings[best]
        knobs = [k for k in choose.knob_candidates(report, at.get("num_workers", workers), cores)
                 if set(k) <= self.knobs]  # fmt: skip
        one_pass = ((report.get("loop") or {}).get("epochs") or 1) <= 1
        hint = any(f.get("id") == "slow-startup" for f in report.get("findings") or [])
        if one_pass and hint and "persistent_workers" in self.knobs:
            self.notes.append(f"persistent_workers not tried: the trials' {self.batches} batches "
                              "hold one pass, where kept workers save nothing; the slow-startup "
                              "finding's hint stands for a job of many epochs")  # fmt: skip
        # NOTE [ Tuning ]: where the workers may be kept, the counts kept workers would want are
        # tried beside the knobs, not in a phase of their own after them
        keep = {"persistent_workers": True}
        recount = keep in knobs and "num_workers" in self.knobs
        counts = choose.recount(at.get("num_workers", workers), cores, rows) if recount else []
        if knobs and not self.out_of_budget:
            tried = {self.add({**at, **k}): k for k in knobs}
            more = [self.add({**at, **keep, "num_workers": n}) for n in counts]
            self.phase(list(dict.fromkeys([best, *tried, *more])), base, seed=101, ref=best)
            kept = [k for name, k in tried.items() if self.ledger.won(name, best)]
            if len(kept) > 1 and not self.out_of_budget:
                both = self.add({**at, **{a: b for k in kept for a, b in k.items()}})
                top = self.ledger.best(base)
                self.phase(list(dict.fromkeys([top, both])), base, seed=201, ref=top)
        best = self.ledger.best(base)
        at = self.settings[best]
        kept_workers = at.get("persistent_workers") and not choose.current(report)[
            "persistent_workers"]
        if kept_workers and not recount and "num_workers" in self.knobs and not self.out_of_budget:
            k = at.get("num_workers", workers)
            more = [self.add({**at, "num_workers": n}) for n in choose.recount(k, cores, rows)]
            if more:  # NOTE [ Tuning ]: with the workers kept, the best count moves up
                self.phase([best, *more], base, seed=301, ref=best)

    def climb(self, report: dict[str, Any], base: str, best: str) -> dict[str, Any] | None:
        """The ceiling ladder's runs at the chosen setting, once each (NOTE [ The ceiling
        ladder ] in analyze/tune.py)."""
        at = self.settings[best]
        modes = ["replay", "cold"]
        if at.get("num_workers", choose.current(report)["num_workers"]):
            modes.insert(1, "nothing")
        names = {"replay": "compute alone", "nothing": "no hand-over", "cold": "cold page cache"}
        measured: dict[str, float | None] = {}
        for mode in modes:
            if self.spent() + self.typical() > self.budget_s:
                self.notes.append("the budget ran out before the ceiling ladder's runs")
                break
            self.progress(f"ceiling ladder: {names[mode]}", self.done, self.planned)
            name = self.add({**at, "_mode": mode})
            result = self.trial(name, None)
            ok = not result.get("error") and result.get("cold_processes") != 0
            measured[names[mode]] = result.get("samples_per_s") if ok else None
            if result.get("cold_processes") == 0:
                self.notes.append("the script read no file through Python's open(): no cold "
                                  "page cache rung")  # fmt: skip
        rates = self.ledger.rates
        return choose.ladder(choose.median(rates.get(base, [])),
                             choose.median(rates.get(best, [])) if best != base else None,
                             measured, choose.model_ceiling(report))  # fmt: skip

    def _result(self, report: dict[str, Any], rows: list[dict[str, Any]], base: str,
                best: str) -> dict[str, Any]:
        trials = []
        for name, settings in self.settings.items():
            runs = self.runs.get(name, [])
            if not runs or "_mode" in settings:  # the ladder's runs: in its own table
                continue
            rates = self.ledger.rates.get(name, [])
            trials.append({
                "setting": name, "settings": settings, "runs": len(runs),
                "samples_per_s": choose.median(rates), "rates": rates,
                "promised_samples_per_s": choose.promised(settings, rows),
                "vs_baseline": self.ledger.gain(name, base) if name != base else None,
                "dropped": name in self.ledger.stopped, "error": self.ledger.failed.get(name),
            })  # fmt: skip
        chosen = self.settings[best]
        changed = best != base
        result: dict[str, Any] = {
            "schema": SCHEMA, "script": self.target, "args": self.args,
            "loader": (report.get("meta") or {}).get("run_loader"),
            "baseline": choose.current(report), "verdict": (report.get("verdict") or {}).get(
                "headline"),
            "trials": trials, "chosen": chosen, "chosen_setting": best, "changed": changed,
            "gain": self.ledger.gain(best, base) if changed else None,
            "budget_s": self.budget_s, "spent_s": round(self.spent(), 1), "notes": self.notes,
            "diff": None, "edit_error": None,
        }  # fmt: skip
        if changed and not self.module:
            try:
                result["diff"], result["new_source"] = self.proposed(chosen)
            except Exception as exc:  # no edit, never the tune's figures lost
                result["edit_error"] = str(exc) or type(exc).__name__
        return result

    def proposed(self, settings: dict[str, Any]) -> tuple[str, str]:
        """The diff of the script that makes ``settings``, and the new source."""
        name, _, line = self.site.rpartition(":")
        path = script_file(self.target, name)
        source = Path(path).read_text(encoding="utf-8")
        new = edit.edited(source, int(line), settings)
        return edit.diff(os.path.relpath(path), source, new), new


def script_file(target: str, base: str) -> str:
    """The file a loader was made in (``base``, a file name): the script, or a file next to it."""
    script = os.path.abspath(target)
    if os.path.basename(script) == base:
        return script
    near = os.path.join(os.path.dirname(script), base)
    if os.path.exists(near):
        return near
    raise edit.NoLoaderCall(f"the loader was made in {base}, not found next to the script")


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def apply(result: dict[str, Any], target: str) -> str:
    """Write the proposed edit into the script's file; returns the path written."""
    if not result.get("changed") or not result.get("new_source"):
        raise TuneError("nothing to apply: the script's settings are already the best found")
    site = (result.get("loader") or {}).get("site", "")
    path = script_file(target, site.rpartition(":")[0])
    Path(path).write_text(result["new_source"], encoding="utf-8")
    return path
