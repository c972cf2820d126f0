"""Stage paths, nesting and self time, with a fake clock."""

import pytest

import pipeprof
from pipeprof.core import recorder as recmod
from pipeprof.core.recorder import recorder, timed_call, timed_call1
from pipeprof.core.session import Session


def stats_of(payload):
    """A drain's records as Stats per path, as the session folds them."""
    s = Session()
    s.merge(payload)
    s.settle()
    return s.stages[payload["track"]]


class FakeClock:
    def __init__(self):
        self.now = 0

    def __call__(self):
        return self.now


@pytest.fixture
def fake(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(recmod, "clock", clock)
    rec = recorder()
    rec.enabled = True
    rec.reset("main")
    yield clock
    rec.enabled = False
    rec.reset("main")


def test_detached_stage_is_subtracted_and_relative_stage_included(fake):
    rec = recorder()

    def transform(x):
        fake.now += 3_000
        return x

    frame = rec.open("load")
    fake.now += 1_000
    with pipeprof.stage("read"):  # relative: load/read, part of load
        fake.now += 2_000
    timed_call("transform/T", transform, 1)  # absolute: detached from load
    fake.now += 500
    rec.close(frame, detach=True)
    stats = stats_of(rec.drain())
    assert stats["load"].total_ns == 3_500  # 1000 + 2000 + 500, not the transform's 3000
    assert stats["load/read"].total_ns == 2_000
    assert stats["transform/T"].total_ns == 3_000


def test_a_transform_in_a_relative_stage_is_detached_from_every_enclosing_stage(fake):
    """``__getitem__`` runs its transform inside ``with pipeprof.stage("decode")``: the
    transform's time comes out of ``load/decode`` and out of ``load`` too. A grandchild is
    subtracted once (it is inside the transform), siblings add up."""
    rec = recorder()

    def inner(x):
        fake.now += 400
        return x

    def transform(x):
        fake.now += 3_000
        return timed_call1("transform/inner", inner, x)  # inside the transform: not load's

    def getitem(i):
        fake.now += 1_000
        with pipeprof.stage("decode"):
            fake.now += 2_000
            timed_call1("transform/T", transform, i)
            with pipeprof.stage("crop"):
                fake.now += 50
                timed_call1("transform/T", transform, i)
        fake.now += 500
        return i

    assert timed_call1("load", getitem, 7) == 7
    frame = rec.open("load")  # the same through open/close (IterDataset, __getitems__)
    getitem(8)
    rec.close(frame, detach=True)
    stats = stats_of(rec.drain())
    assert stats["load"].total_ns == 2 * 3_550  # 1000 + 2000 + 50 + 500
    assert stats["load/decode"].total_ns == 2 * 2_050  # 2000 + crop's 50
    assert stats["load/decode/crop"].total_ns == 2 * 50
    assert stats["transform/T"].total_ns == 4 * 3_000 and stats["transform/T"].count == 4
    assert stats["transform/inner"].total_ns == 4 * 400


def test_a_close_skipped_by_an_exception_leaves_later_records_right(fake):
    rec = recorder()
    outer = rec.open("load")
    rec.open("transform/lost")  # never closed
    fake.now += 1_000
    rec.close(outer, detach=True)
    assert rec.innermost is None
    frame = rec.open("load")
    with pipeprof.stage("read"):
        fake.now += 200
    fake.now += 100
    rec.close(frame, detach=True)
    stats = stats_of(rec.drain())
    assert stats["load"].count == 2 and stats["load"].total_ns == 1_300
    assert sorted(stats) == ["load", "load/read"]


def test_stage_outside_a_profile_is_a_no_op_and_bad_names_fail():
    with pipeprof.stage("x"):
        pass
    assert not recorder().raw
    with pytest.raises(ValueError, match="relative name"), pipeprof.stage("/abs"):
        pass


def test_exception_in_a_stage_still_closes_it(fake):
    rec = recorder()
    with pytest.raises(RuntimeError, match="mine"), pipeprof.stage("outer"):
        fake.now += 10
        timed_call("boom", _raise)
    assert rec.innermost is None
    stats = stats_of(rec.drain())
    assert stats["outer"].count == 1 and stats["boom"].count == 1


def _raise():
    raise RuntimeError("mine")


def test_per_item_durations_for_batched_loads(fake):
    rec = recorder()
    frame = rec.open("load")
    fake.now += 8_000
    rec.close(frame, n=4)
    stat = stats_of(rec.drain())["load"]
    assert stat.count == 4 and stat.total_ns == 8_000 and stat.max_ns == 2_000
    for n, ns in ((1, 500), (4, 8_000), (1, 700)):  # one path, records of 1 and of 4 items
        frame = rec.open("load")
        fake.now += ns
        rec.close(frame, n=n)
    stat = stats_of(rec.drain())["load"]
    assert (stat.count, stat.total_ns, stat.min_ns, stat.max_ns) == (6, 9_200, 500, 2_000)


def test_stages_in_helper_threads_nest_under_the_pipeline_stage():
    """A dataset that decodes in a thread pool inside ``load``: every decode is one
    ``load/decode`` record, none nested in another thread's frame, none lost."""
    from concurrent.futures import ThreadPoolExecutor

    rec = recorder()
    rec.reset("main")
    rec.enabled = True
    try:

        def decode(i):
            with pipeprof.stage("decode"), pipeprof.stage("huffman"):
                sum(range(2000))
            return i

        with ThreadPoolExecutor(4) as pool:
            frame = rec.open("load")
            assert list(pool.map(decode, range(400))) == list(range(400))
            rec.close(frame)
        assert rec.innermost is None
        stats = stats_of(rec.drain())
    finally:
        rec.enabled = False
        rec.reset("main")
    assert sorted(stats) == ["load", "load/decode", "load/decode/huffman"]
    assert stats["load/decode"].count == 400 and stats["load/decode/huffman"].count == 400


def test_a_decorated_function_is_a_relative_stage_wherever_it_is_called(fake):
    """``@pipeprof.stage(name)``: each call is the stage ``name`` under whatever stage is open,
    as ``with pipeprof.stage(name)`` would be (its last path is reused only under the same
    parent), with one argument, several, or keywords; its result and exceptions pass through."""
    rec = recorder()

    @pipeprof.stage("decode")
    def decode(x, extra=0):
        fake.now += 1_000 + extra
        if x is None:
            raise KeyError("bad sample")
        return x

    assert decode(1) == 1  # top level: "decode"
    frame = rec.open("load")
    assert decode(2) == 2 and decode(3, 500) == 3 and decode(4, extra=500) == 4  # load/decode
    rec.close(frame, detach=True)
    assert decode(5) == 5  # top level again, after load/decode
    with pipeprof.stage("outer"), pytest.raises(KeyError, match="bad sample"):
        decode(None)
    stats = stats_of(rec.drain())
    assert stats["decode"].count == 2 and stats["decode"].total_ns == 2_000
    assert stats["load/decode"].count == 3 and stats["load/decode"].total_ns == 4_000
    assert stats["outer/decode"].count == 1 and stats["load"].total_ns == 4_000
