"""The live terminal view (NOTE [ The live view ] in collect/live.py), read from a real
pseudo-terminal while the script trains: the panel refreshes with figures that agree with the
report, the script's own lines all come through, and without a terminal nothing changes."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

import pipeprof

TRAIN = """
import time
import torch
from torch.utils.data import DataLoader, Dataset


class Slow(Dataset):
    def __len__(self):
        return 400

    def __getitem__(self, i):
        time.sleep(0.004)  # 2 workers make a batch of 8 in 16 ms; the step takes 10
        return torch.full((8,), float(i))


if __name__ == "__main__":
    loader = DataLoader(Slow(), batch_size=8, num_workers=2, persistent_workers=True)
    for epoch in range(10):
        for step, batch in enumerate(loader):
            time.sleep(0.01)
            if step % 25 == 0:
                print(f"epoch {epoch} step {step} mean {float(batch.mean()):.1f}", flush=True)
    print("done")
"""

LIBRARY = """
import sys, time
import torch
from torch.utils.data import DataLoader, TensorDataset
import pytest

import pipeprof

prof = pipeprof.Profiler(sample_hz=0, live=True)
loader = DataLoader(TensorDataset(torch.arange(4000.0)), batch_size=8)
for batch in prof.wrap(loader):
    time.sleep(0.008)
prof.stop()
print("done")
"""

_ESC = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_TITLE = re.compile(r"pipeprof · epoch (\d+) · step (\d+) · (\d+) s")


def in_pty(argv: list[str], cwd: Path, timeout: float = 90) -> tuple[str, str, int]:
    """Run ``argv`` on a pseudo-terminal: what the screen got while it ran (read until the
    panel had shown 3 distinct steps, the child still alive), all it got, its exit status."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: stdout and stderr are the terminal
        os.chdir(cwd)
        os.environ["COLUMNS"] = "100"
        os.execv(argv[0], argv)
    out, mid, t0 = b"", "", time.monotonic()
    while time.monotonic() - t0 < timeout:
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready:
            try:
                data = os.read(fd, 65536)
            except OSError:  # the child closed the terminal
                break
            if not data:
                break
            out += data
        if not mid:
            seen = _ESC.sub("", out.decode(errors="replace"))
            alive = os.waitpid(pid, os.WNOHANG) == (0, 0)
            if alive and len({m[1] for m in _TITLE.findall(seen)}) >= 3:
                mid = seen
    _, status = os.waitpid(pid, 0)
    return mid, _ESC.sub("", out.decode(errors="replace")), os.waitstatus_to_exitcode(status)


def test_the_panel_refreshes_mid_run_and_the_scripts_lines_scroll_above_it(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    mid, screen, code = in_pty([sys.executable, "-m", "pipeprof", "run", "--live", "-o",
                                "run.json", str(script)], tmp_path)  # fmt: skip
    assert code == 0
    assert mid, "no panel with 3 distinct steps while the script ran"
    steps = sorted({int(m[1]) for m in _TITLE.findall(mid)})
    assert len(steps) >= 3 and steps[-1] > steps[0]
    rates = [float(r.replace(",", "")) for r in re.findall(r"throughput\s+([\d,.]+) samples/s",
                                                            mid)]  # fmt: skip
    report = pipeprof.load(tmp_path / "run.json").to_dict()
    final = report["loop"]["throughput"]["effective_samples_per_s"]
    assert rates and 0.6 * final < rates[-1] < 1.5 * final, (rates, final)
    waits = [int(w) for w in re.findall(r"waiting\s+(\d+)% \(starved \d+%, hand-over", mid)]
    assert waits and waits[-1] >= 15  # input-bound by construction
    assert abs(waits[-1] / 100 - report["loop"]["wait_fraction"]) < 0.2, waits
    assert re.search(r"workers\s+0: \d+%\s+1: \d+%", mid)
    printed = [f"epoch {e} step {s} mean" for e in range(10) for s in (0, 25)]
    where = [screen.find(line) for line in printed]
    assert all(w >= 0 for w in where) and where == sorted(where)  # none lost, in order
    assert "done" in screen and "main loop: 10 pass(es)" in screen


def test_a_profiler_made_with_live_shows_the_panel_too(tmp_path):
    script = tmp_path / "lib.py"
    script.write_text(LIBRARY)
    mid, screen, code = in_pty([sys.executable, str(script)], tmp_path)
    assert code == 0 and mid and "done" in screen
    assert re.search(r"throughput\s+[\d,.]+ samples/s", mid)


def test_without_a_terminal_there_is_no_panel_and_the_output_is_plain(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    plain = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                           check=True, cwd=tmp_path)  # fmt: skip
    live = subprocess.run([sys.executable, "-m", "pipeprof", "run", "--live", "-o", "run.json",
                           str(script)], capture_output=True, text=True, check=True,
                          cwd=tmp_path)  # fmt: skip
    assert live.stdout == plain.stdout
    assert not _TITLE.search(live.stderr)


def scrape(port: int, timeout: float = 60) -> dict[str, float]:
    """One scrape of ``/metrics`` on 127.0.0.1:``port`` once it answers: ``name{labels}`` ->
    value, pipeprof's series only."""
    import urllib.request

    t0 = time.monotonic()
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                text = r.read().decode()
            break
        except OSError:
            if time.monotonic() - t0 > timeout:
                raise
            time.sleep(0.2)
    got = {}
    for line in text.splitlines():
        if line.startswith("pipeprof_"):
            key, _, value = line.rpartition(" ")
            got[key] = float(value)
    return got


def test_the_metrics_endpoint_serves_the_figures_while_the_script_runs(tmp_path):
    """``pipeprof run --metrics-port``: scraped twice on localhost during the run, with rank and
    loader labels; the endpoint is gone when the run ends."""
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    port = 29871
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeprof", "run", "-q", "--metrics-port", str(port), "-o",
         "run.json", str(script)], cwd=tmp_path, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    at = '{loader="loader",rank="0"}'
    try:
        first = scrape(port)
        while not first.get(f"pipeprof_steps_total{at}"):  # from the first batch on
            time.sleep(0.2)
            first = scrape(port)
        time.sleep(2.5)
        second = scrape(port)
        assert proc.poll() is None  # both during the run
    except BaseException:
        proc.kill()  # the port is free for the next run
        raise
    assert second[f"pipeprof_steps_total{at}"] > first[f"pipeprof_steps_total{at}"] > 0
    assert second[f"pipeprof_samples_per_second{at}"] > 0
    assert 0.05 < second[f"pipeprof_wait_fraction{at}"] < 1
    workers = [k for k in second if k.startswith("pipeprof_worker_cpu_fraction")]
    assert sorted(workers) == [f'pipeprof_worker_cpu_fraction{{loader="loader",rank="0",'
                               f'worker="{w}"}}' for w in (0, 1)]  # fmt: skip
    assert second['pipeprof_host_memory_used_bytes{rank="0"}'] > 0
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-2000:]
    try:
        scrape(port, timeout=0)
    except OSError:
        pass
    else:
        raise AssertionError("the endpoint still serves after the run")


def test_a_bad_metrics_address_is_refused_before_the_script_runs(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print('ran')")
    done = subprocess.run([sys.executable, "-m", "pipeprof", "run", "--metrics-port", "http",
                           str(script)], capture_output=True, text=True, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 2 and "ran" not in done.stdout
    assert "--metrics-port takes a port (9100) or HOST:PORT" in done.stderr


@pytest.mark.slow
def test_each_rank_of_a_torchrun_job_serves_its_own_figures(tmp_path):
    """2 ranks (gloo, DDP) under torchrun with --metrics-port P: rank 0 on P, rank 1 on P + 1
    (its local rank), each labelled with its rank, scraped during the job."""
    from test_distributed import DDP_TRAIN, env

    port = 29881
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
           "--master_port=29889", "-m", "pipeprof", "run", "-q", "--metrics-port", str(port),
           "-o", "run.json", DDP_TRAIN, "--samples", "4096", "--step-ms", "10"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        got = {rank: scrape(port + rank) for rank in (0, 1)}
        assert proc.poll() is None
    except BaseException:
        proc.kill()
        raise
    for rank, figures in got.items():
        assert any(f'rank="{rank}"' in k for k in figures if k.startswith("pipeprof_steps"))
        assert not any(f'rank="{1 - rank}"' in k for k in figures)
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err[-2000:]


NOTEBOOK_CELL = """
import time
import torch
from torch.utils.data import DataLoader, TensorDataset
import pipeprof

prof = pipeprof.Profiler(sample_hz=0, live=True)
loader = DataLoader(TensorDataset(torch.arange(4000.0)), batch_size=8)
t0 = time.perf_counter()
for batch in prof.wrap(loader):
    time.sleep(0.008)
loop_s = time.perf_counter() - t0
frames = prof._live.frames if prof._live else -1
prof.stop()
print(f"loop {loop_s:.2f} s, frames {frames}")
"""


def test_in_a_notebook_the_report_updates_in_place(tmp_path_factory):
    """A real kernel (nbclient, ipykernel) runs a cell with Profiler(live=True): one output
    display, updated in place as the loop runs (its last figures stay), while the loop's own
    print still comes."""
    import nbformat
    from test_notebook import execute

    nb = nbformat.v4.new_notebook()
    nb.cells.append(nbformat.v4.new_code_cell(NOTEBOOK_CELL))
    execute(nb, tmp_path_factory)
    outputs = nb.cells[0].outputs
    shown = [o for o in outputs if o.output_type == "display_data"]
    assert len(shown) == 1  # one output, updated in place: not one per frame
    page = shown[0].data["text/html"]
    steps = int(re.search(r"step (\d+)", page)[1])
    assert steps == 500 and re.search(r"throughput</th><td[^>]*>[\d,.]+ samples/s", page)
    printed = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    got = re.search(r"loop (\d+\.\d+) s, frames (\d+)", printed)
    assert got and int(got[2]) >= 2  # redrawn while the loop ran (about 4 s)


def test_the_gpu_line_comes_from_the_nvml_samplers_latest_reading():
    """No GPU here: the real NVML sampler over the fake pynvml (tests/fake_nvml.py), read by
    the live figures and drawn on the panel and in the notebook's table."""
    from fake_nvml import FakeGpu, FakeNvml

    from pipeprof.collect.live import LiveFigures
    from pipeprof.collect.samplers import NvmlSampler
    from pipeprof.render.live import html, lines

    sampler = NvmlSampler(hz=50, nvml=FakeNvml([FakeGpu(util=(37,), samples=None,
                                                        mem_used=3 << 30)])).start()  # fmt: skip
    try:
        time.sleep(0.3)
        fig = LiveFigures(lambda: [], sampler.latest).tick()
    finally:
        sampler.stop()
    assert fig["gpu"] == [{"index": 0, "util": 37.0, "mem_used_mb": 3072.0}]
    assert ("GPU 0", "37% busy, 3,072 MB") in lines(fig)
    assert "37% busy, 3,072 MB" in html(fig)
