"""A ReFrame regression test of a training job's input pipeline, measured by pipeprof.

It runs a training script under ``pipeprof run`` (no change to the script) and reports, as
ReFrame performance variables, the loop's effective throughput (samples per second of the whole
loop, waits included), its compute throughput (samples per second of compute alone: the rate if
data were free) and the fraction of the loop's time spent waiting for data; the stage that limits
throughput (``load/decode``, ``transform/RandomResizedCrop``...; empty when data kept up) is the
test variable ``limiting_stage``, in ReFrame's report and perflogs. The figures come from the
report pipeprof writes (``run.json``, schema ``pipeprof/1``: docs/schema.md).

    reframe -C examples/reframe/config.py -c examples/reframe/pipeprof_check.py -r
    reframe ... -r -S script=/path/to/train.py -S script_opts='--epochs 1 --lr 0.1'

See docs/integrations.md, section ReFrame. Needs ``pip install 'pipeprof[reframe,torch]'``.
"""

import json
import os

import reframe as rfm
import reframe.utility.sanity as sn
from reframe.core.builtins import (
    performance_function,
    run_after,
    run_before,
    sanity_function,
    variable,
)

HERE = os.path.dirname(os.path.abspath(__file__))


@rfm.simple_test
class PipelineThroughputCheck(rfm.RunOnlyRegressionTest):
    """Effective and compute samples/s, wait fraction and the limiting stage of a training
    loop, profiled by ``pipeprof run``."""

    descr = "Input pipeline of a training loop, profiled by pipeprof"
    valid_systems = ["*"]
    valid_prog_environs = ["*"]
    sourcesdir = None
    num_tasks = 1
    time_limit = "30m"
    tags = {"pipeprof", "ml", "io"}
    keep_files = ["run.json"]  # pipeprof's report, kept in the output folder

    #: how to call pipeprof (``python -m pipeprof`` where its script is not on PATH)
    pipeprof = variable(str, value="pipeprof")
    #: the training script, and its own options (a short run of pipeprof's example by default)
    script = variable(str, value=os.path.join(HERE, "..", "train.py"))
    script_opts = variable(str, value="--images 64 --batch-size 16 --workers 1")
    #: the stage that limits throughput, read from the report ("" when data kept up)
    limiting_stage = variable(str, value="")
    #: pipeprof's regression gate on the report (``pipeprof check``, docs/gate.md): fixed
    #: budgets the run must meet, beside ReFrame's references; "" checks none
    gate = variable(str, value="--max overhead_fraction=0.1")

    # Your systems' baselines go first: more than 10 % below them fails. The values here are
    # placeholders for a system named "mycluster"; everywhere else the figures are recorded in
    # the perflogs and not judged (reference 0, no bounds).
    reference = {
        "mycluster:gpu": {
            "samples_per_s": (2400.0, -0.10, None, "samples/s"),
            "compute_samples_per_s": (2600.0, -0.10, None, "samples/s"),
            "wait_fraction": (0.05, None, 3.0, ""),  # at most 0.20: TensorFlow's input-bound
        },
        "*": {
            "samples_per_s": (0, None, None, "samples/s"),
            "compute_samples_per_s": (0, None, None, "samples/s"),
            "wait_fraction": (0, None, None, ""),
        },
    }

    @run_after("init")
    def set_command(self):
        self.executable = self.pipeprof
        self.executable_opts = ["run", "--out", "run.json", self.script, *self.script_opts.split()]
        if self.gate:  # the gate's verdict as JSON; the sanity check reads it
            self.postrun_cmds = [f"{self.pipeprof} check run.json {self.gate} --format json "
                                 "> gate.json || true"]  # fmt: skip

    @run_before("sanity")
    def read_report(self):
        """The report pipeprof wrote ({} when there is none: the sanity check says so)."""
        try:
            with open(os.path.join(self.stagedir, "run.json")) as f:
                self.report = json.load(f)
        except (OSError, ValueError):
            self.report = {}
        verdict = self.report.get("verdict") or {}
        self.limiting_stage = verdict.get("stage") or ""
        self.gate_result = {"passed": True, "failed": []}
        if self.gate:
            try:
                with open(os.path.join(self.stagedir, "gate.json")) as f:
                    self.gate_result = json.load(f)
            except (OSError, ValueError):
                self.gate_result = {"passed": False, "failed": ["no gate.json: see stderr"]}

    @sanity_function
    def profiled_loop(self):
        loop = self.report.get("loop") or {}
        stages = self.report.get("stages") or {}
        return sn.all([
            sn.assert_eq(self.report.get("schema"), "pipeprof/1",
                         msg="no pipeprof report in run.json (see the job's stderr)"),
            sn.assert_false(self.report.get("interrupted"), msg="the profiled run was cut short"),
            sn.assert_gt(loop.get("steps") or 0, 0, msg="pipeprof saw no training step"),
            sn.assert_true(self.limiting_stage in ("", *stages),
                           msg="the limiting stage {0} is not a stage of the report"),
            sn.assert_true(self.gate_result["passed"],
                           msg=f"pipeprof's gate failed: {self.gate_result['failed']}"),
        ])  # fmt: skip

    def _loop(self, *keys):
        value = self.report["loop"]
        for key in keys:
            value = value[key]
        return value

    @performance_function("samples/s")
    def samples_per_s(self):
        """Effective throughput: samples per second of the whole loop, waits included."""
        return self._loop("throughput", "effective_samples_per_s")

    @performance_function("samples/s")
    def compute_samples_per_s(self):
        """Compute throughput: samples per second of compute alone (data free)."""
        return self._loop("throughput", "compute_samples_per_s")

    @performance_function("")
    def wait_fraction(self):
        """Fraction of the loop's time spent waiting for data (0-1)."""
        return self._loop("wait_fraction")
