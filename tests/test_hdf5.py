"""h5py reads inside profiled DataLoaders: timed, counted (bytes, chunks, filter), the read
amplification finding and the fork hazard. Real files in a tmp dir, real h5py, real workers."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch
from h5data import EagerH5, LazyH5, NestedH5, field, write
from torch.utils.data import DataLoader

import pipeprof
from pipeprof.collect import hdf5
from pipeprof.core.recorder import counts, recorder
from pipeprof.core.session import Session
from pipeprof.render.figures import num

MIB = 2**20
ORIGINAL = h5py.Dataset.__dict__["__getitem__"], h5py.Dataset.__dict__["read_direct"]


@pytest.fixture(autouse=True)
def h5py_left_as_found():
    yield
    assert (h5py.Dataset.__dict__["__getitem__"], h5py.Dataset.__dict__["read_direct"]) == ORIGINAL
    assert not hdf5.installed()


def h5_rows(report):
    return {r["dataset"]: r for r in report.to_dict().get("hdf5", [])}


def finding_of(report, fid):
    found = [f for f in report.to_dict()["findings"] if f["id"] == fid]
    return found[0] if found else None


def brute_chunks(shape, chunks, sel):
    """The chunk coordinates a selection touches, from every element it reads."""
    idx = np.indices(shape).reshape(len(shape), -1).T
    mask = np.zeros(shape, bool)
    mask[sel] = True
    picked = idx[mask.reshape(-1)]
    return {tuple(int(v) for v in c) for c in np.unique(picked // np.array(chunks), axis=0)}


SELECTIONS = [
    3, -1, np.int64(5), np.s_[2:9], np.s_[1:20:5], np.s_[1:20:3], np.s_[:, 2:5],
    np.s_[..., 3], np.s_[7, ..., 1:9], [1, 5, 6], np.s_[[0, 9, 23], 1], np.array([2, 3, 17]),
]  # fmt: skip


@pytest.mark.parametrize("compression", [None, "gzip"])
def test_each_selection_counts_the_chunks_every_element_lies_in(tmp_path, compression):
    """Chunks touched, bytes returned, decoded and stored per read, against a brute force over
    every element read; what the read returns is what h5py returns unprofiled."""
    path = tmp_path / "sel.h5"
    data = field(24, 6, 10)
    write(path, "x", data, chunks=(4, 3, 4), compression=compression)
    rec = recorder()
    with h5py.File(path, "r") as f:
        d = f["x"]
        plain = [d[s] for s in SELECTIONS]
        assert hdf5.install()
        rec.enabled = True
        before = rec.enter({})
        try:
            for s, want in zip(SELECTIONS, plain):
                sink = rec.enter({})
                got = d[s]
                mine = counts(rec.sink)["h5"][f"{path}:/x"]
                rec.leave(sink)
                np.testing.assert_array_equal(got, want)
                touched = brute_chunks(d.shape, d.chunks, s)
                stored = sum(d.id.get_chunk_info_by_coord(
                    tuple(c * k for c, k in zip(t, d.chunks))).size for t in touched)  # fmt: skip
                assert mine["chunks"] == len(touched), s
                assert mine["returned_bytes"] == want.nbytes, s
                assert mine["decoded_bytes"] == len(touched) * 4 * 3 * 4 * 4, s
                if len(touched) <= hdf5.EXACT_CHUNKS:  # each chunk looked up
                    assert mine["stored_bytes"] == stored and not mine["stored_estimated"], s
                else:  # the dataset's mean stored chunk, and said so
                    mean = d.id.get_storage_size() / d.id.get_num_chunks()
                    assert mine["stored_bytes"] == round(mean * len(touched)), s
                    assert mine["stored_estimated"] == len(touched), s
        finally:
            rec.leave(before)
            rec.enabled = False
            hdf5.uninstall()


@pytest.mark.parametrize("workers,ctx", [(0, None), (2, "fork"), (2, "spawn")])
def test_reads_in_workers_are_timed_and_counted(tmp_path, workers, ctx):
    """d[i] in a lazily opened file, in workers under fork and spawn and in the main process:
    a load/read stage per read, bytes and chunks as the file's own metadata says, and the
    same batches as unprofiled."""
    path = tmp_path / "t.h5"
    write(path, "x", field(64, 16, 16), chunks=(8, 16, 16), compression="gzip", shuffle=True)
    loader = DataLoader(LazyH5(path, n=32), batch_size=4, num_workers=workers,
                        multiprocessing_context=ctx)  # fmt: skip
    report = pipeprof.profile(loader)
    stages = report.to_dict()["stages"]
    assert stages["load/read"]["count"] == 32
    assert 0 < stages["load/read"]["total_s"] <= stages["load"]["total_s"] + 1e-9
    row = h5_rows(report)["/x"]
    with h5py.File(path, "r") as f:
        d = f["x"]
        stored = sum(d.id.get_chunk_info_by_coord((i // 8 * 8, 0, 0)).size for i in range(32))
    assert row["reads"] == 32 and row["returned_bytes"] == 32 * 16 * 16 * 4
    assert row["chunks_per_read"] == 1.0
    assert row["decoded_amplification"] == 8.0  # a chunk of 8 steps for each step read
    assert row["stored_amplification"] == pytest.approx(stored / (32 * 16 * 16 * 4), abs=1e-4)
    assert row["filter"] == "shuffle+gzip" and row["chunks"] == [8, 16, 16]
    assert row["read_shape"] == [1, 16, 16]
    assert row["read_s"] == pytest.approx(stages["load/read"]["total_s"], rel=0.01)
    if ctx != "spawn":  # each spawn pass costs seconds here: the batches are checked once
        plain = list(loader)
        again = list(pipeprof.Profiler(sample_hz=0).wrap(loader))
        assert len(plain) == len(again) == 8
        assert all(torch.equal(a, b) for a, b in zip(plain, again))


@pytest.mark.parametrize("how", ["fancy", "direct", "block", "reopen"])
def test_fancy_indexing_read_direct_and_reopened_datasets(tmp_path, how):
    path = tmp_path / "f.h5"
    write(path, "x", field(40, 4, 4), chunks=(4, 4, 4))
    ds = LazyH5(path, how=how, step=5 if how == "block" else 3)
    report = pipeprof.profile(DataLoader(ds, batch_size=5))
    row = h5_rows(report)["/x"]
    n = len(ds)
    if how == "fancy":
        want = sum(len({i // 4, (i + 3) // 4}) for i in range(n))
        per = 2
    elif how == "block":
        want = sum((i + 4) // 4 - i // 4 + 1 for i in range(n))
        per = 5
    else:
        want, per = n, 1
    assert row["reads"] == n
    assert row["chunks_per_read"] == pytest.approx(want / n, abs=1e-4)
    assert row["returned_bytes"] == n * per * 4 * 4 * 4
    assert report.to_dict()["stages"]["load/read"]["count"] == n


def test_a_users_own_read_stage_times_the_read_and_pipeprof_only_counts_it(tmp_path):
    path = tmp_path / "u.h5"
    write(path, "x", field(16, 4, 4), chunks=(4, 4, 4))
    report = pipeprof.profile(DataLoader(OwnStage(path), batch_size=4))
    stages = report.to_dict()["stages"]
    assert stages["load/read"]["count"] == 16
    assert not [p for p in stages if p.startswith("load/read/")]
    assert h5_rows(report)["/x"]["reads"] == 16


class OwnStage(LazyH5):
    def __getitem__(self, i):
        with pipeprof.stage("read"):
            return super().__getitem__(i)


@pytest.mark.timing
def test_a_bad_chunk_layout_gives_the_amplification_finding_and_rechunking_pays(tmp_path):
    """One step read at random from gzip chunks of 288 steps (1.1 MiB, above a 1 MiB chunk
    cache, HDF5's default before 2.0, asked for here): 288× decoded per byte returned, every
    read. Rechunked to one step per chunk the finding goes and the reads get much faster."""
    bad, good = tmp_path / "bad.h5", tmp_path / "good.h5"
    data = field(288, 32, 32)
    write(bad, "x", data, chunks=(288, 32, 32), compression="gzip")
    write(good, "x", data, chunks=(1, 32, 32), compression="gzip")

    def run(path):
        g = torch.Generator().manual_seed(0)
        loader = DataLoader(LazyH5(path, n=288, rdcc_nbytes=MIB), batch_size=4, shuffle=True,
                            generator=g, num_workers=2, multiprocessing_context="fork")  # fmt: skip
        return pipeprof.profile(loader, batches=12)

    report = run(bad)
    f = finding_of(report, "h5-read-amplification")
    assert f is not None and f["severity"] == "warning" and f["evidence"]["cache_bytes"] == MIB
    expected = (288 * 32 * 32) / (1 * 32 * 32)  # chunk elements / elements a read returns
    assert f["evidence"]["decoded_amplification"] == expected
    assert f["evidence"]["chunks_per_read"] == 1.0 and f["evidence"]["every_read_decodes"]
    assert f["evidence"]["read_shape"] == [1, 32, 32]
    assert "chunks=(1, 32, 32)" in f["fix"] and "rdcc_nbytes" in f["fix"] and "lzf" in f["fix"]
    assert "pipeprof bench TARGET --encodings" in f["fix"]  # the rate after it, measured
    # the section in text and HTML: the dataset's row with its layout against its reads
    row = h5_rows(report)["/x"]
    line = [ln for ln in report.render("text").splitlines() if ln.startswith("bad.h5:/x")]
    assert len(line) == 1 and line[0].split() == [
        "bad.h5:/x", str(row["reads"]), num(row["read_ms_mean"]), "288×32×32", "gzip",
        "1×32×32", "1.00", "×288"]  # fmt: skip
    html = report.render("html")
    assert "<h2>HDF5 reads</h2>" in html and "<td>288×32×32 gzip</td><td>1×32×32</td>" in html
    after = run(good)
    assert finding_of(after, "h5-read-amplification") is None
    assert h5_rows(after)["/x"]["decoded_amplification"] == 1.0
    slow, fast = h5_rows(report)["/x"]["read_ms_mean"], h5_rows(after)["/x"]["read_ms_mean"]
    assert slow > 10 * fast, (slow, fast)


def test_the_first_epoch_s_reads_are_kept_apart_from_later_ones(tmp_path):
    """Three epochs of a training loop: the rows give the first epoch's ms per read and the
    later epochs', each from its own reads (a third of them the first epoch's)."""
    path = tmp_path / "e.h5"
    write(path, "x", field(32, 64, 64), chunks=(1, 64, 64), compression="gzip")
    loader = DataLoader(LazyH5(path), batch_size=8)
    prof = pipeprof.Profiler(sample_hz=0, stage_every=1)  # every read counted
    with prof:
        for _ in range(3):
            for _ in prof.wrap(loader):
                pass
    report = prof.report()
    e = report.session.h5
    (entry,) = e.values()
    assert entry["reads"] == 96 and entry["later"]["reads"] == 64
    row = h5_rows(report)["/x"]
    first_ns = entry["read_ns"] - entry["later"]["read_ns"]
    assert row["first_epoch_read_ms"] == pytest.approx(first_ns / 32 / 1e6, rel=1e-4)
    assert row["later_read_ms"] == pytest.approx(entry["later"]["read_ns"] / 64 / 1e6, rel=1e-4)
    line = f"e.h5:/x: first epoch {num(row['first_epoch_read_ms'])} ms a read, later epochs"
    assert line in report.render("text") and line in report.render("html")
    # one pass: no split
    assert h5_rows(pipeprof.profile(loader))["/x"]["first_epoch_read_ms"] is None


def test_unfiltered_chunks_larger_than_the_cache_are_not_amplified(tmp_path):
    """HDF5 reads only the selected part of an unfiltered chunk that does not fit the chunk
    cache: the decoded figure is there, but no finding claims the bytes are read. Where the
    1.1 MiB chunk fits the cache it is read whole into it, and the finding says so."""
    path = tmp_path / "raw.h5"
    write(path, "x", field(288, 32, 32), chunks=(288, 32, 32))
    report = pipeprof.profile(DataLoader(LazyH5(path, n=16, rdcc_nbytes=MIB), batch_size=4))
    assert h5_rows(report)["/x"]["decoded_amplification"] == 288.0
    assert finding_of(report, "h5-read-amplification") is None
    report = pipeprof.profile(DataLoader(LazyH5(path, n=16, rdcc_nbytes=4 * MIB), batch_size=4))
    f = finding_of(report, "h5-read-amplification")
    assert f is not None and f["severity"] == "info" and f["evidence"]["cache_bytes"] == 4 * MIB


@pytest.mark.parametrize("cache", [MIB, 4 * MIB, None])
def test_the_finding_follows_the_chunk_cache_the_file_is_opened_with(tmp_path, cache):
    """The same 1.1 MiB chunks under a 1 MiB chunk cache, a 4 MiB one and the HDF5 library's
    own default (1 MiB before HDF5 2.0, 8 MiB from it): the cache in the row and the finding is
    the one the file was opened with, as HDF5 reports it, never a fixed default; gzip chunks
    decoded again by every read only where they do not fit it, unfiltered chunks flagged only
    where they do (read whole into it)."""
    chunk = 288 * 32 * 32 * 4
    gz, raw = tmp_path / "gz.h5", tmp_path / "raw.h5"
    write(gz, "x", field(288, 32, 32), chunks=(288, 32, 32), compression="gzip")
    write(raw, "x", field(288, 32, 32), chunks=(288, 32, 32))
    with h5py.File(gz, "r", **({} if cache is None else {"rdcc_nbytes": cache})) as f:
        opened = f.id.get_access_plist().get_cache()[2]  # the file's rdcc_nbytes
    assert opened == (cache or opened) > 0
    fits = chunk <= opened
    for path in (gz, raw):
        report = pipeprof.profile(DataLoader(LazyH5(path, n=8, rdcc_nbytes=cache), batch_size=4))
        assert h5_rows(report)["/x"]["cache_bytes"] == opened
        f = finding_of(report, "h5-read-amplification")
        if path == raw:
            assert (f is not None) == fits, (opened, f)
            continue
        assert f is not None and f["evidence"]["cache_bytes"] == opened
        assert f["severity"] == ("info" if fits else "warning")
        assert f["evidence"]["every_read_decodes"] is (not fits)
        # a larger cache is offered only where it is larger than the one the file has
        assert ("rdcc_nbytes=3 * 2**20" in f["fix"]) is (opened < 3 * MIB)
        assert ("rdcc_nbytes" in f["fix"]) is (opened < 3 * MIB)


def test_contiguous_and_closed_files_give_no_wrong_number(tmp_path):
    path = tmp_path / "c.h5"
    write(path, "x", field(16, 4, 4))  # contiguous: no chunks
    report = pipeprof.profile(DataLoader(LazyH5(path), batch_size=4))
    row = h5_rows(report)["/x"]
    assert row["kind"] == "contiguous" and row["reads"] == 16
    assert row["note"].startswith("not chunked (contiguous)")
    assert row["chunks_per_read"] is None and row["decoded_amplification"] is None
    assert row["returned_bytes"] == 16 * 4 * 4 * 4
    assert finding_of(report, "h5-read-amplification") is None
    closed = EagerH5(path)
    closed.f.close()
    assert hdf5.inherited_handles(closed) == []
    loader = DataLoader(closed, batch_size=4)
    with pytest.raises(Exception) as plain:
        list(loader)
    with pytest.raises(type(plain.value)) as profiled:
        pipeprof.profile(loader)
    assert str(profiled.value) == str(plain.value)


def test_an_open_file_inherited_by_forked_workers_is_reported(tmp_path):
    path = tmp_path / "e.h5"
    write(path, "x", field(16, 4, 4), chunks=(4, 4, 4))
    eager = EagerH5(path)
    try:
        loader = DataLoader(eager, batch_size=4, num_workers=2, multiprocessing_context="fork")
        f = finding_of(pipeprof.profile(loader), "h5-fork-hazard")
        assert f is not None and f["severity"] == "warning"
        where = {h["where"] for h in f["evidence"]["handles"]}
        assert where == {"dataset.f", "dataset.d"}
        assert "worker_init_fn" in f["fix"] and "__getitem__" in f["fix"]
        # without workers nothing forks: no hazard
        alone = pipeprof.profile(DataLoader(eager, batch_size=4))
        assert finding_of(alone, "h5-fork-hazard") is None
    finally:
        eager.f.close()


def test_the_lazy_pattern_is_not_a_hazard_until_the_parent_opens_it(tmp_path):
    path = tmp_path / "l.h5"
    write(path, "x", field(16, 4, 4), chunks=(4, 4, 4))
    lazy = LazyH5(path)
    loader = DataLoader(lazy, batch_size=4, num_workers=2, multiprocessing_context="fork")
    assert finding_of(pipeprof.profile(loader), "h5-fork-hazard") is None
    lazy[0]  # the parent reads once: its handle is what the next workers inherit
    try:
        f = finding_of(pipeprof.profile(loader), "h5-fork-hazard")
        assert f is not None and f["evidence"]["handles"][0]["where"] == "dataset.f"
    finally:
        lazy.f.close()
    nested = NestedH5(path)
    try:
        found = hdf5.inherited_handles(nested)
        assert [h["where"] for h in found] == ["dataset.store.handles['x']"]
    finally:
        nested.store.handles["x"].close()


def test_the_counts_survive_save_and_load(tmp_path):
    path = tmp_path / "s.h5"
    write(path, "x", field(16, 4, 4), chunks=(4, 4, 4), compression="lzf")
    report = pipeprof.profile(DataLoader(LazyH5(path), batch_size=4))
    report.save(tmp_path / "r.json")
    again = pipeprof.load(tmp_path / "r.json")
    assert h5_rows(again) == h5_rows(report)
    assert h5_rows(again)["/x"]["filter"] == "lzf"
    assert Session.from_dict({"schema_version": 1}).h5 == {}  # older files: none


def test_nothing_is_timed_outside_a_profile(tmp_path):
    path = tmp_path / "n.h5"
    write(path, "x", field(8, 4, 4), chunks=(4, 4, 4))
    rec = recorder()
    with h5py.File(path, "r") as f:
        assert hdf5.install()
        try:
            f["x"][2]
            assert not rec.raw
        finally:
            hdf5.uninstall()
