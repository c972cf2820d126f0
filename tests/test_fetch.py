"""Network reads as their own stage (NOTE [ Timing network reads ] in collect/fetch.py): a real
HTTP server on 127.0.0.1 with a known latency, read by datasets through urllib and requests,
in the training process and in fork and spawn workers; a local-file near miss."""

from __future__ import annotations

import time

import pytest
import torch
from netdata import (
    BODY,
    LATENCY_S,
    ROWS,
    SERVED,
    Local,
    Remote,
    S3fsObjects,
    S3Objects,
    rows,
    s3_server,
    server,
)
from pipelines import plain_and_profiled, same_batches
from torch.utils.data import DataLoader

import pipeprof
from pipeprof.analyze import fetch as analyze_fetch
from pipeprof.collect import fetch as collect_fetch

N = 32


def _profile(dataset, workers: int, context: str | None = None):
    """The loader's batches plain and profiled (the same), and the profile's report."""
    kw = {"multiprocessing_context": context} if workers else {}
    loader = DataLoader(dataset, batch_size=8, num_workers=workers, **kw)
    plain = list(loader)
    prof = pipeprof.Profiler(sample_hz=0)
    with prof:
        got = list(prof.wrap(loader))
    assert len(got) == len(plain) and all(torch.equal(a, b) for a, b in zip(plain, got))
    return prof.report()


@pytest.mark.parametrize(
    ("workers", "context", "client"),
    [(0, None, "urllib"), (2, "fork", "urllib"), (2, "spawn", "urllib"), (0, None, "requests"),
     (0, None, "fsspec"), (2, "fork", "fsspec"), (2, "spawn", "fsspec"),
     (2, "fork", "fsspec-stream")],
)  # fmt: skip
def test_requests_are_the_fetch_stage_with_their_latency_and_bytes(workers, context, client):
    """Each sample's request (20 ms at the server) and body (64 kB) are ``load/fetch``; the 5 ms
    of other work in ``__getitem__`` is not. The host's row counts each request and byte once
    (``read(n)`` calls ``readinto``: counted once), in whichever process read them. fsspec's
    HTTP filesystem (NOTE [ fsspec's async filesystems ] in collect/fetch.py) makes its requests
    on its own IO thread over aiohttp, while the worker waits: the same stage and counts; a
    streamed file's (``block_size=0``: its size asked first) too."""
    with server() as url:
        before = sum(SERVED.values())
        report = _profile(Remote(url, N, client), workers, context)
        d = report.to_dict()
    served = (sum(SERVED.values()) - before) // 2  # the profiled pass's, as the plain one's
    port = url.rsplit(":", 1)[1].strip("/")
    stages = d["stages"]
    fetch, load = stages["load/fetch"], stages["load"]
    assert fetch["per_sample_ms"] >= LATENCY_S * 1e3
    assert fetch["per_sample_ms"] <= load["per_sample_ms"] - 4  # the 5 ms sleep is load's own
    (row,) = d["fetch"]
    assert row["host"] == f"127.0.0.1:{port}"
    # a streamed file's size asked first (HEAD), then the file: all of them counted
    assert served == (2 * N if client == "fsspec-stream" else N)
    assert row["requests"] == served and row["bytes"] == N * BODY
    assert row["latency_ms_mean"] >= LATENCY_S * 1e3
    assert row["latency_ms_p50"] >= 32  # the bucket holding 20 ms and more: (16, 32]
    assert row["read_mb_s"] > 0 and row["fetch_s"] >= N * LATENCY_S
    assert row.keys() == analyze_fetch.FetchRow.__annotations__.keys() == _schema_keys("fetch")
    assert "network reads (HTTP, all processes)" in report.render("text")
    assert "<h2>Network reads (load/fetch)</h2>" in report.render("html")
    # the originals are back once the profile ends
    assert not collect_fetch.installed() and not collect_fetch.SYNC.installed()
    assert not collect_fetch.AIO.installed() and not collect_fetch.HTTP.installed()


@pytest.mark.parametrize("workers", [0, 2])
def test_s3_reads_with_boto3_are_the_fetch_stage(workers):
    """boto3's ``get_object`` against a real S3 server (moto's) that answers in 20 ms: each
    object's request and its 64 kB are ``load/fetch``, once each; boto3's own work (making
    and signing the request) and the 5 ms after it are ``load``'s, not the fetch's."""
    with s3_server(N) as url:
        report = _profile(S3Objects(url, N), workers, "fork" if workers else None)
    d = report.to_dict()
    fetch, load = d["stages"]["load/fetch"], d["stages"]["load"]
    assert LATENCY_S * 1e3 <= fetch["per_sample_ms"] <= load["per_sample_ms"] - 4
    (row,) = d["fetch"]
    assert row["host"] == url.removeprefix("http://")
    assert row["requests"] == N and row["bytes"] == N * BODY


@pytest.mark.parametrize(("workers", "context"), [(0, None), (2, "fork"), (2, "spawn")])
def test_s3_reads_through_s3fs_are_the_fetch_stage(workers, context):
    """s3fs's ``cat_file`` (aiobotocore over aiohttp, on fsspec's IO thread) against the same
    server: a HEAD and a GET an object, each counted with its latency, and every body's bytes
    once (read from the response's stream, not through ``ClientResponse.read``); the wait is
    ``load/fetch``, the 5 ms after it is not."""
    with s3_server(N) as url:
        report = _profile(S3fsObjects(url, N), workers, context)
    d = report.to_dict()
    fetch, load = d["stages"]["load/fetch"], d["stages"]["load"]
    assert 2 * LATENCY_S * 1e3 <= fetch["per_sample_ms"] <= load["per_sample_ms"] - 4
    (row,) = d["fetch"]
    assert row["host"] == url.removeprefix("http://")
    assert row["requests"] == 2 * N and row["bytes"] == N * BODY


def test_a_read_through_readinto_counts_its_bytes_once(monkeypatch):
    """Python 3.10's ``HTTPResponse.read(n)`` reads through ``readinto``: the body's bytes and
    time are counted once, by the outer call."""
    import http.client

    own = http.client.HTTPResponse.read

    def read_310(self, amt=None):
        if amt is None:
            return own(self)
        b = bytearray(amt)
        n = self.readinto(b)
        return bytes(memoryview(b)[:n])

    monkeypatch.setattr(http.client.HTTPResponse, "read", read_310)
    with server() as url:
        report = _profile(Remote(url, N, "requests"), 0)
    (row,) = report.to_dict()["fetch"]
    assert row["requests"] == N and row["bytes"] == N * BODY
    assert http.client.HTTPResponse.read is read_310  # the one it found, put back


@pytest.mark.parametrize("slow", [False, True])
def test_the_fetch_fix_names_latency_or_transfer_as_measured(slow):
    """A fetch that limits the pipeline gets the fix of what takes its time: 20 ms before the
    first byte (more requests in flight, larger objects), or a body that comes in 16 parts
    1.5 ms apart with no wait before it (fewer bytes, a closer store). Followed for the first:
    2 to 4 workers took the steady rate from 72 to 154-156 samples/s (docs/streaming.md). The
    what-if of a batch's samples in one request promises much for the first, little for the
    second (benchmarks/fetch_batched.py follows it)."""
    with server() as url:
        report = _profile(Remote(url + ("slow/" if slow else ""), N, "urllib", 0.0), 2, "fork")
    d = report.to_dict()
    (found,) = [f for f in d["findings"] if f["id"] == "dominant-stage"]
    ev = found["evidence"]
    gain = ev["samples_per_s_batched"] / ev["samples_per_s_now"]
    objects = [w for w in d["what_if"] if w["kind"] == "objects"]
    if slow:
        assert found["fix"].startswith("the bodies take ") and "fewer bytes" in found["fix"]
        assert gain < 1.25, ev  # the near miss: no first-byte wait to share out
        assert not objects and "samples a request" not in report.render("text")
        assert not [w for w in d["what_if"] if w["kind"] == "in_flight"]
        return
    assert found["fix"].startswith("each request waits ") and "in flight" in found["fix"]
    # NOTE [ Objects that hold a batch ]: 8 samples a request share one 20 ms wait
    assert "one request a batch" in found["fix"] and gain > 3, ev
    # the what-if's rows for objects of a batch's samples, 4 batches' and 16 (shards of that
    # size; followed at 32 and 128 by benchmarks/fetch_batched.py): the batch's row is the
    # fix's promise, and larger objects share the wait further
    assert [w["samples_per_request"] for w in objects] == [8, 32, 128]
    assert objects[0]["samples_per_s"] == ev["samples_per_s_batched"]
    # (no faster than the rest of the loader allows: on a loaded machine 32 and 128 samples a
    # request both reached the main process's own rate, 571 samples/s, once)
    rates = [w["samples_per_s"] for w in objects]
    assert rates[0] < rates[1] <= rates[2], rates
    assert all(w["now_samples_per_request"] == 1.0 and w["workers"] == 2 for w in objects)
    # and 2, 4, 8 requests in flight a worker (a pool over a batch's samples; followed at 4
    # and 8 by benchmarks/fetch_batched.py): n in flight wait for their first bytes together
    flying = [w for w in d["what_if"] if w["kind"] == "in_flight"]
    assert [w["requests_in_flight"] for w in flying] == [2, 4, 8]
    assert flying[0]["now_samples_per_s"] < flying[0]["samples_per_s"] < flying[1]["samples_per_s"]
    assert flying[2]["samples_per_s"] == objects[0]["samples_per_s"]  # one wait for 8, either way
    text = " ".join(report.render("text").split())
    assert "what if (samples a request → the loader's samples/s, 2 workers, estimated): now 1 →" \
        in text and "requests in flight a worker (a thread pool in __getitems__): 2 →" in text
    html = report.render("html")
    assert "What if larger objects" in html and "8 in flight a worker" in html


def _schema_keys(row: str) -> set[str]:
    """The keys docs/schema.md gives the row ``row`` (a list of one object)."""
    from test_report import _schema_shape

    return set(_schema_shape(row))


def test_requests_of_the_loop_itself_are_not_the_pipelines(tmp_path):
    """A request the training loop makes between batches (a logger's upload) is no stage of
    the pipeline's; one from a thread pool inside ``__getitem__`` is ``load/fetch``."""
    import urllib.request

    path = tmp_path / "sample.bin"
    path.write_bytes(b"\x07" * BODY)
    with server() as url:
        prof = pipeprof.Profiler(sample_hz=0)
        with prof:
            for _ in prof.wrap(DataLoader(Local(str(path), 16), batch_size=4)):
                urllib.request.urlopen(url + "1", timeout=30).read()
        pooled = _profile(Remote(url, 16, "pool"), 0)
    d = prof.report().to_dict()
    assert "fetch" not in d and not any(p.endswith("fetch") for p in d["stages"])
    (row,) = pooled.to_dict()["fetch"]
    assert row["requests"] == 16 and "load/fetch" in pooled.to_dict()["stages"]


def test_local_reads_have_no_fetch_stage(tmp_path):
    """The near miss: the same samples read from a local file show no ``load/fetch`` and no
    network section."""
    path = tmp_path / "sample.bin"
    path.write_bytes(b"\x07" * BODY)
    report = _profile(Local(str(path), N), 2, "fork")
    d = report.to_dict()
    assert "load/fetch" not in d["stages"] and "fetch" not in d
    assert "load/read" not in d["stages"]
    assert "network reads" not in report.render("text")


@pytest.mark.parametrize(("workers", "context"), [(0, None), (2, "fork"), (2, "spawn")])
def test_local_files_through_fsspec_are_the_read_stage(tmp_path, workers, context):
    """fsspec's local files (NOTE [ fsspec's async filesystems ], 8): each sample's read is
    ``load/read``, not a fetch, and no network section; plain ``open()`` gets no such stage
    (the test above)."""
    path = tmp_path / "sample.bin"
    path.write_bytes(b"\x07" * BODY)
    report = _profile(Local(str(path), N, "fsspec"), workers, context)
    d = report.to_dict()
    assert "load/fetch" not in d["stages"] and "fetch" not in d
    read = d["stages"]["load/read"]
    assert read["count"] == N and 0 < read["per_sample_ms"] < d["stages"]["load"]["per_sample_ms"]
    assert "network reads" not in report.render("text")


def test_the_latency_histogram_is_read_by_its_bucket_bounds():
    """analyze/ reads the buckets collect/ counts into (``core.units.LATENCY_BOUNDS_MS``)."""
    assert analyze_fetch.LATENCY_BOUNDS_MS is collect_fetch.LATENCY_BOUNDS_MS
    hist = [0] * (len(analyze_fetch.LATENCY_BOUNDS_MS) + 1)
    assert analyze_fetch.quantile_bound(hist, 0.5) is None
    hist[3] = 90  # (1, 2] ms
    hist[6] = 10  # (8, 16] ms
    assert analyze_fetch.quantile_bound(hist, 0.5) == 2.0
    assert analyze_fetch.quantile_bound(hist, 0.95) == 16.0
    hist[-1] = 100  # past the last bound: not known
    assert analyze_fetch.quantile_bound(hist, 0.95) is None


MAP_MS = 3.0


def slow_row(row):  # type: ignore[no-untyped-def]
    """The user's map: 3 ms a row."""
    time.sleep(MAP_MS / 1e3)
    return row


@pytest.mark.timing
@pytest.mark.parametrize(("workers", "shuffled"), [(0, True), (2, True), (2, False)])
def test_each_step_of_a_hugging_face_stream_is_a_stage(workers, shuffled):
    """NOTE [ A Hugging Face stream's steps ]: 4 JSON-lines files over HTTP (20 ms before each
    answer), a 3 ms ``.map`` a row, a shuffle buffer of 16, torch formatting. Each step is its
    own stage: the files' reading with its fetch inside, the map at its 3 ms a row, the shuffle
    buffer at its own small cost, the rows formatted; the wait for the shards' threads apart.
    The batches are plain's. Near miss: without ``.shuffle`` there is no shuffle stage."""
    import datasets

    with server() as url:
        files = [f"{url}rows-{i}.jsonl" for i in range(4)]
        ds = datasets.load_dataset("json", data_files=files, streaming=True, split="train")
        ds = ds.map(slow_row)
        if shuffled:
            ds = ds.shuffle(seed=0, buffer_size=16)
        loader = DataLoader(ds.with_format("torch"), batch_size=8, num_workers=workers)
        plain = [b["x"] for b in loader]
        prof = pipeprof.Profiler(sample_hz=0)
        with prof:
            got = [b["x"] for b in prof.wrap(loader)]
    assert len(got) == len(plain) == 4 * ROWS // 8
    assert all(torch.equal(a, b) for a, b in zip(plain, got))
    stages = prof.report().to_dict()["stages"]
    assert MAP_MS <= stages["load/map/slow_row"]["per_sample_ms"] <= 2 * MAP_MS
    assert stages["load/map/slow_row"]["count"] >= 4 * ROWS
    read, fetch = stages["load/read"], stages["load/read/fetch"]
    assert fetch["total_s"] >= 4 * LATENCY_S and read["total_s"] >= fetch["total_s"]
    assert stages["load/format"]["count"] >= 4 * ROWS
    if shuffled:  # the shards read on threads of their own: the wait for them apart
        assert "load/interleave" in stages
        assert stages["load/shuffle"]["per_sample_ms"] < MAP_MS / 10
    else:
        assert "load/shuffle" not in stages


@pytest.mark.parametrize("workers", [0, 2])
def test_a_hugging_face_streaming_dataset_over_http_is_load_and_fetch(workers):
    """``load_dataset("json", data_files=<http URLs>, streaming=True)``: datasets reads the
    files through fsspec's HTTP filesystem (aiohttp on its IO thread: NOTE [ fsspec's async
    filesystems ] in collect/fetch.py), a size asked and ranges read. Every request the server
    answered in the profiled pass is counted, each file's bytes once; the fetch's time is at
    least the server's 20 ms a request; the batches are the plain pass's."""
    import datasets

    with server() as url:
        files = [f"{url}rows-{i}.jsonl" for i in range(2)]
        ds = datasets.load_dataset("json", data_files=files, streaming=True, split="train")
        loader = DataLoader(ds.with_format("torch"), batch_size=8, num_workers=workers)
        before = sum(SERVED.values())
        plain = [b["x"] for b in loader]
        between = sum(SERVED.values())
        prof = pipeprof.Profiler(sample_hz=0)
        with prof:
            got = [b["x"] for b in prof.wrap(loader)]
        served = sum(SERVED.values()) - between
    assert served == between - before > 0  # the same requests as the plain pass made
    assert len(got) == len(plain) == 2 * ROWS // 8
    assert all(torch.equal(a, b) for a, b in zip(plain, got))
    d = prof.report().to_dict()
    fetch = d["stages"]["load/fetch"]
    assert fetch["per_sample_ms"] * 2 * ROWS >= served * LATENCY_S * 1e3
    (row,) = d["fetch"]
    assert row["requests"] == served and row["bytes"] == sum(len(rows(i)) for i in range(2))


def _webdataset(url: str, shards: int):  # type: ignore[no-untyped-def]
    import webdataset as wds

    urls = [f"{url}shard-{i}.tar" for i in range(shards)]
    return wds.WebDataset(urls, shardshuffle=False, empty_check=False).decode().to_tuple(
        "npy", "cls"
    )


@pytest.mark.parametrize(("workers", "context"), [(0, None), (2, "fork"), (2, "spawn")])
def test_webdatasets_shard_streams_are_the_fetch_stage(workers, context):
    """WebDataset reads http shards through curl's pipe, not http.client: each of the 4 shards
    (20 ms before the server answers) is one request with its bytes, under ``load/fetch``; the
    samples are the plain loader's. 2 workers split the shards 2 and 2."""
    pytest.importorskip("webdataset")
    from netdata import SHARD_SAMPLES, shard

    kw = {"num_workers": workers, "multiprocessing_context": context} if workers else {}
    with server() as url:
        plain, got, prof = plain_and_profiled(DataLoader(_webdataset(url, 4), batch_size=8, **kw))
    assert len(got) == 4 * SHARD_SAMPLES // 8 and same_batches(plain, got)
    report = prof.report().to_dict()
    (row,) = report["fetch"]
    assert row["host"] == url.split("/")[2]
    assert row["requests"] == 4 and row["bytes"] == sum(len(shard(i)) for i in range(4))
    assert row["latency_ms_mean"] >= 20  # the server's wait, and curl's start
    assert report["stages"]["load/tar_file_expander/fetch"]["total_s"] >= 4 * 0.020


def test_local_shards_have_no_fetch_stage(tmp_path):
    """The near miss: the same shards from local files are read, not fetched."""
    pytest.importorskip("webdataset")
    import webdataset as wds
    from netdata import shard

    for i in range(2):
        (tmp_path / f"shard-{i}.tar").write_bytes(shard(i))
    files = [str(tmp_path / f"shard-{i}.tar") for i in range(2)]
    data = wds.WebDataset(files, shardshuffle=False, empty_check=False).decode()
    report = pipeprof.profile(DataLoader(data.to_tuple("npy", "cls"), batch_size=8)).to_dict()
    assert not report.get("fetch") and "load/fetch" not in report["stages"]


def _passes(dataset, workers: int, n: int = 2) -> dict:
    """``n`` passes of a profiled loop over the dataset: its report."""
    prof = pipeprof.Profiler(sample_hz=0)
    wrapped = prof.wrap(DataLoader(dataset, batch_size=4, num_workers=workers))
    for _ in range(n):
        for _batch in wrapped:
            pass
    return prof.report().to_dict()


@pytest.mark.parametrize("workers", [0, 2])
def test_a_fetch_made_again_every_epoch_gets_a_cache_the_size_of_a_pass(tmp_path, workers):
    """NOTE [ A cache for later epochs ]: two passes over 32 remote samples (20 ms and 64 kB
    each, 5 ms of other work): ``fetch-cache``, sized at a pass's bodies (32 × 64 kB), promised
    faster with the fetch cached. Near misses: one pass (nothing read again), the same samples
    from a local file, and a fetch that is a small share (100 ms of other work a sample)."""
    with server() as url:
        twice = _passes(Remote(url, N), workers)
        once = _passes(Remote(url, N), workers, n=1)
        small = _passes(Remote(url, 8, work_s=0.1), workers)
    path = tmp_path / "body"
    path.write_bytes(bytes(BODY))
    local = _passes(Local(str(path), N), workers)
    found = {f["id"]: f for f in twice["findings"]}["fetch-cache"]
    ev = found["evidence"]
    assert ev["passes"] == 2 and ev["samples_per_pass"] == N
    assert ev["cache_mb"] == pytest.approx(N * BODY / 1e6, rel=0.01)
    assert ev["share"] >= 0.5 and found["severity"] == "warning"
    assert ev["samples_per_s_cached"] > ev["samples_per_s_now"]
    assert f"about {N * BODY / 1e6:.3g} MB" in found["fix"] and "cache_dir" in found["fix"]
    for near in (once, small, local):
        assert "fetch-cache" not in {f["id"] for f in near["findings"]}
