"""A damaged or edited file gives `pipeprof.load`, `pipeprof.compare` and the command line one
clear ValueError naming the file and the part that is wrong, never a traceback; keys this
pipeprof does not know are ignored."""

import copy
import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from machine import PIPEPROF
from pipelines import CostDataset
from torch.utils.data import DataLoader

import pipeprof

LOOP = Path(__file__).parent / "golden" / "session-loop.json"  # a recorded training loop


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A report saved by a real profile, and its JSON."""
    report = pipeprof.profile(DataLoader(CostDataset(8), batch_size=2, num_workers=1), batches=2)
    path = report.save(tmp_path_factory.mktemp("saved") / "good.json")
    return report, path, json.loads(path.read_text())


def _first(d):
    return next(iter(d))


def _stage(s):
    track = _first(s["stages"])
    return track, _first(s["stages"][track])


def set_stat_string(s):
    track, path = _stage(s)
    s["stages"][track][path] = "fast"
    return f"session.stages.{track}.{path} should be an object of statistics"


def set_stat_field_string(s):
    track, path = _stage(s)
    s["stages"][track][path]["count"] = "many"
    return f"session.stages.{track}.{path}.count should be a whole number"


def set_wait_null(s):
    s["wait"] = None
    return "session.wait should be an object of statistics (count, total_ns, ...), not null"


def set_short_batch_row(s):
    s["batch_ring"][0] = s["batch_ring"][0][:5]
    return "session.batch_ring[0] should be [index, track, ready_ns, wait_ns, samples, busy_ns]"


def set_span_start_string(s):
    s["spans"][0][2] = "soon"
    return "session.spans[0] should be [track, path, start_ns, duration_ns]"


def set_worker_list(s):
    w = _first(s["workers"])
    s["workers"][w] = [1, 2]
    return f"session.workers.{w} should be an object, not a list"


def set_worker_busy_null(s):
    w = _first(s["workers"])
    s["workers"][w]["busy_ns"] = None
    return f"session.workers.{w}.busy_ns should be a whole number, not null"


def set_version_string(s):
    s["schema_version"] = "1"
    return 'session.schema_version should be a whole number of 1 or more (this pipeprof writes 1), not a string ("1")'  # noqa: E501


def set_meta_list(s):
    s["meta"] = ["x"]
    return "session.meta should be an object"


def set_mode_unknown(s):
    s["mode"] = "train"
    return 'session.mode should be "loader" or "loop"'


def set_num_workers_word(s):  # meta is free-form: caught while analysing, still by name
    s["meta"]["num_workers"] = "two"
    return "holds a session that cannot be analysed (ValueError"


LOADER_EDITS = [
    set_stat_string,
    set_stat_field_string,
    set_wait_null,
    set_short_batch_row,
    set_span_start_string,
    set_worker_list,
    set_worker_busy_null,
    set_version_string,
    set_meta_list,
    set_mode_unknown,
    set_num_workers_word,
]


def set_loop_steps_string(s):
    s["loop"]["steps"] = "20"
    return "session.loop.steps should be a whole number"


def set_short_step_row(s):
    s["loop"]["step_ring"][3] = [1, 2]
    return "session.loop.step_ring[3] should be [t_request_ns, wait_ns, transfer_ns,"


def set_loop_part_string(s):
    s["loop"]["first"]["wait"] = "slow"
    return "session.loop.first.wait should be an object of statistics"


def set_replay_list(s):
    s["loop"]["replay"] = [1]
    return "session.loop.replay should be an object or null"


LOOP_EDITS = [set_loop_steps_string, set_short_step_row, set_loop_part_string, set_replay_list]


def edited(data, edit, path):
    data = copy.deepcopy(data)
    part = edit(data["session"])
    path.write_text(json.dumps(data))
    return part


def assert_clear(exc_info, path, part):
    message = str(exc_info.value)
    assert str(path) in message and part in message, message
    assert "upgrade" not in message
    assert "report.save(path)" in message  # what to do


@pytest.mark.parametrize("edit", LOADER_EDITS, ids=lambda e: e.__name__)
def test_load_names_the_file_and_the_part(saved, edit, tmp_path):
    _, good, data = saved
    bad = tmp_path / "bad.json"
    part = edited(data, edit, bad)
    with pytest.raises(ValueError) as exc_info:
        pipeprof.load(bad)
    assert_clear(exc_info, bad, part)
    with pytest.raises(ValueError) as exc_info:  # compare reads files through the same load
        pipeprof.compare(good, bad)
    assert_clear(exc_info, bad, part)


@pytest.mark.parametrize("edit", LOOP_EDITS, ids=lambda e: e.__name__)
def test_loop_record_names_the_part(edit, tmp_path):
    bad = tmp_path / "loop.json"
    part = edited(json.loads(LOOP.read_text()), edit, bad)
    with pytest.raises(ValueError) as exc_info:
        pipeprof.load(bad)
    assert_clear(exc_info, bad, part)


def test_session_that_is_no_object_and_binary_and_future_files(saved, tmp_path):
    _, _, data = saved
    listed = tmp_path / "listed.json"
    listed.write_text(json.dumps({**data, "session": [data["session"]]}))
    with pytest.raises(ValueError) as exc_info:
        pipeprof.load(listed)
    assert_clear(exc_info, listed, "session should be an object, not a list")
    binary = tmp_path / "image.json"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe" * 10)
    with pytest.raises(ValueError, match="is not a pipeprof JSON file: it is not UTF-8") as e:
        pipeprof.load(binary)
    assert str(binary) in str(e.value)
    for version in (2, 10**6):  # only a newer whole number asks for an upgrade
        future = tmp_path / "future.json"
        future.write_text(json.dumps({"session": {**data["session"], "schema_version": version}}))
        with pytest.raises(ValueError, match="upgrade pipeprof") as e:
            pipeprof.load(future)
        assert str(future) in str(e.value)
    for version in (0, 1.0, True, None):
        odd = tmp_path / "odd.json"
        odd.write_text(json.dumps({"session": {**data["session"], "schema_version": version}}))
        with pytest.raises(ValueError, match="schema_version should be a whole number") as e:
            pipeprof.load(odd)
        assert "upgrade" not in str(e.value)


def test_extra_keys_are_ignored(saved, tmp_path):
    report, _, data = saved
    data = copy.deepcopy(data)
    s = data["session"]
    s["added_later"] = {"x": 1}
    s["workers"][_first(s["workers"])]["added_later"] = 1
    s["wait"]["added_later"] = [1]
    track, path = _stage(s)
    s["stages"][track][path]["added_later"] = "x"
    extra = tmp_path / "extra.json"
    extra.write_text(json.dumps(data))
    assert pipeprof.load(extra).to_dict() == report.to_dict()
    loop = json.loads(LOOP.read_text())
    loop["session"]["loop"]["added_later"] = 1
    loop["session"]["loop"]["first"]["wait"]["added_later"] = 1
    (tmp_path / "loop.json").write_text(json.dumps(loop))
    assert pipeprof.load(tmp_path / "loop.json").to_dict() == pipeprof.load(LOOP).to_dict()


def test_a_file_from_an_older_pipeprof_loads_and_reads_as_it_did():
    """Recorded before the wait was split and before LoopRecord (Stats tagged ``__stat__``): a
    loop and a loader; they load, their wait counts as starved, and the verdict and finding
    read as they did then."""
    old = pipeprof.load(LOOP.with_name("session-loop-old.json")).to_dict()
    loop = old["loop"]
    assert "__stat__" in LOOP.with_name("session-loop-old.json").read_text()
    assert loop["steps"] == 20 and not loop["wait_split_known"]
    assert loop["starved_s"] == loop["wait_s"] > 0 and loop["handover_s"] == 0
    assert old["verdict"]["kind"] == "input-bound" and old["verdict"]["cause"] == "starved"
    assert old["verdict"]["stage"] == "load/decode"
    assert "workers-needed" in {f["id"] for f in old["findings"]}
    assert "the wait" not in str(pipeprof.load(LOOP.with_name("session-loop-old.json")))
    loader = pipeprof.load(LOOP.with_name("session-loader-old.json")).to_dict()["wait"]
    assert not loader["split_known"] and loader["handover_s"] == 0
    assert loader["starved_s"] == loader["total_s"] > 0


def test_plain_report_json_that_is_damaged_is_named_by_compare(saved, tmp_path):
    report, good, _ = saved
    plain = report.to_dict()  # `pipeprof report --format json`: no session, compares as it is
    plain["throughput"] = None
    bad = tmp_path / "plain.json"
    bad.write_text(json.dumps(plain))
    with pytest.raises(ValueError, match="is a damaged pipeprof report") as e:
        pipeprof.compare(good, bad)
    assert str(bad) in str(e.value)


def cli(*args):
    return subprocess.run(
        [*PIPEPROF, *map(str, args)], capture_output=True, text=True, timeout=120,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip


def test_command_line_names_the_file_exit_2_no_traceback(saved, tmp_path):
    _, good, data = saved
    files = []
    for edit in (set_stat_string, set_wait_null, set_short_batch_row, set_worker_list):
        files.append(tmp_path / f"{edit.__name__}.json")
        edited(data, edit, files[-1])
    files.append(tmp_path / "listed.json")
    files[-1].write_text(json.dumps({**data, "session": []}))
    files.append(tmp_path / "binary.json")
    files[-1].write_bytes(bytes(range(256)))
    for bad in files:
        for args in (["report", bad], ["compare", good, bad], ["compare", bad, good]):
            res = cli(*args)
            assert res.returncode == 2, (args, res.stderr)
            assert res.stderr.startswith("pipeprof: ") and str(bad) in res.stderr, res.stderr
            assert "Traceback" not in res.stderr, res.stderr
    extra = tmp_path / "extra.json"
    edited(data, lambda s: s["workers"][_first(s["workers"])].update(added_later=1), extra)
    res = cli("report", extra, "--format", "json")
    assert res.returncode == 0 and json.loads(res.stdout)["batches"] == 2, res.stderr


def test_free_form_gpu_figures_that_are_damaged_are_named_when_rendered(tmp_path):
    data = json.loads(LOOP.read_text())  # the GPU samples are read by the renderers, not on load
    data["session"]["gpu"]["devices"][0] = "x"
    bad = tmp_path / "gpu.json"
    bad.write_text(json.dumps(data))
    for args in (["report", bad], ["report", bad, "--format", "html"], ["compare", LOOP, bad]):
        res = cli(*args)
        assert res.returncode == 2, (args, res.stderr)
        assert res.stderr.startswith("pipeprof: ") and str(bad) in res.stderr, res.stderr
        assert "Traceback" not in res.stderr, res.stderr
        assert "was the file edited?" in res.stderr or "damaged pipeprof report" in res.stderr


def test_an_absurd_core_count_does_not_hang_analysis(tmp_path):
    """A damaged ``cpu_count`` (1e18) is capped: the what-if search stays small."""
    data = json.loads((Path(__file__).parent / "golden" / "session-loader.json").read_text())
    data["session"]["meta"]["cpu_count"] = 10**18
    if data["session"].get("host"):
        data["session"]["host"]["cpu_count"] = 10**18
    path = tmp_path / "cores.json"
    path.write_text(json.dumps(data))
    t0 = time.perf_counter()
    report = pipeprof.load(path)
    assert time.perf_counter() - t0 < 5
    assert report["what_if"]


def test_a_failed_save_names_the_file_not_its_temporary(tmp_path):
    report = pipeprof.load(Path(__file__).parent / "golden" / "session-loader.json")
    with pytest.raises(OSError) as info:
        report.save(tmp_path / "missing" / "run.json")
    assert str(tmp_path / "missing" / "run.json") in str(info.value)
    assert ".tmp" not in str(info.value)
