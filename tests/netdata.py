"""A local HTTP server with a known latency, and datasets that read from it: the network
collector's tests (tests/test_fetch.py). Importable, so that spawned workers can rebuild them."""

from __future__ import annotations

import collections
import logging
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import fsspec  # as a dataset's module that streams through it would
import s3fs
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

BODY = 64 * 1024  # bytes a response
SERVED: collections.Counter[str] = collections.Counter()  # requests answered, by method
_SERVED_LOCK = threading.Lock()  # the server answers each request on a thread of its own


def _served(method: str) -> None:
    with _SERVED_LOCK:
        SERVED[method] += 1
LATENCY_S = 0.02  # the server's wait before it answers


SHARD_SAMPLES = 16  # a WebDataset shard's samples


def shard(i: int, samples: int = SHARD_SAMPLES) -> bytes:
    """WebDataset shard ``i``: a tar of ``samples`` samples, each a ``.npy`` 32x32 float32
    array of its number and a ``.cls`` label."""
    import io
    import tarfile

    import numpy as np

    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for k in range(samples):
            n = i * samples + k
            array = io.BytesIO()
            np.save(array, np.full((32, 32), n, dtype=np.float32))
            for ext, data in (("npy", array.getvalue()), ("cls", str(n % 10).encode())):
                info = tarfile.TarInfo(f"{n:06d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


ROWS = 64  # a JSON-lines file's rows


def rows(i: int) -> bytes:
    """JSON-lines file ``i``: ROWS rows ``{"x": [n] * 16}``, n numbering them across files."""
    import json

    return b"".join(json.dumps({"x": [i * ROWS + k] * 16}).encode() + b"\n" for k in range(ROWS))


class _Handler(BaseHTTPRequestHandler):
    """``/<i>``: LATENCY_S, then the body at once; ``/slow/<i>``: the headers at once, then
    the body in 16 parts 1.5 ms apart (a transfer-bound fetch); ``/shard-<i>.tar``: LATENCY_S,
    then WebDataset shard ``i``; ``/many/<i>/<k>``: LATENCY_S, then the bodies of ``i`` to
    ``i + k - 1`` in one; ``/rows-<i>.jsonl``: LATENCY_S, then ``rows(i)`` (or the ``Range``
    of it asked); a HEAD: LATENCY_S, then the headers of a GET of the path. Each request
    counted in SERVED."""

    def do_HEAD(self) -> None:  # fsspec asks a file's size first
        _served("HEAD")
        time.sleep(LATENCY_S)
        self.send_response(200)
        if self.path.startswith("/rows-"):
            size = len(rows(int(self.path[len("/rows-") : -len(".jsonl")])))
            self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(size if self.path.startswith("/rows-") else BODY))
        self.end_headers()

    def do_GET(self) -> None:
        _served("GET")
        if self.path.startswith("/rows-"):  # /rows-<i>.jsonl: LATENCY_S, then its rows (a range)
            time.sleep(LATENCY_S)
            body = rows(int(self.path[len("/rows-") : -len(".jsonl")]))
            asked = self.headers.get("Range", "")
            if asked.startswith("bytes="):
                first, _, last = asked[len("bytes=") :].partition("-")
                end = min(len(body), int(last) + 1) if last else len(body)
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {first}-{end - 1}/{len(body)}")
                body = body[int(first) : end]
            else:
                self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        if self.path.startswith("/many/"):  # /many/<i>/<k>: LATENCY_S, then k samples' bodies
            i, k = (int(x) for x in self.path[len("/many/") :].split("/"))
            time.sleep(LATENCY_S)
            body = b"".join(bytes([(i + j) % 251]) * BODY for j in range(k))
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        if self.path.startswith("/shard-"):
            time.sleep(LATENCY_S)
            body = shard(int(self.path[len("/shard-") : -len(".tar")]))
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        slow = self.path.startswith("/slow/")
        if not slow:
            time.sleep(LATENCY_S)
        i = int(self.path.rsplit("/", 1)[1] or 0)
        body = bytes([i % 251]) * BODY
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not slow:
            self.wfile.write(body)
            return
        self.wfile.flush()
        part = BODY // 16
        for k in range(16):
            time.sleep(0.0015)
            self.wfile.write(body[k * part : (k + 1) * part])
            self.wfile.flush()

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def s3_server(keys: int) -> Iterator[str]:
    """A real S3 server (moto's, on werkzeug) on 127.0.0.1 that waits LATENCY_S before each
    answer, holding bucket ``data`` with ``keys`` objects ``<i>`` of BODY bytes; yields its
    endpoint URL."""
    from moto.server import DomainDispatcherApplication, create_backend_app
    from werkzeug.serving import make_server

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line a request
    app = DomainDispatcherApplication(create_backend_app)

    def slow(environ, start_response):  # type: ignore[no-untyped-def]
        time.sleep(LATENCY_S)
        return app(environ, start_response)

    srv = make_server("127.0.0.1", 0, slow, threaded=True)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{srv.port}"
    try:
        client = _s3(url)
        client.create_bucket(Bucket="data")
        for i in range(keys):
            client.put_object(Bucket="data", Key=str(i), Body=bytes([i % 251]) * BODY)
        yield url
    finally:
        srv.shutdown()
        srv.server_close()


def _s3(url: str):  # type: ignore[no-untyped-def]
    import boto3

    return boto3.client("s3", endpoint_url=url, region_name="us-east-1",
                        aws_access_key_id="testing", aws_secret_access_key="testing")  # fmt: skip


class S3Objects(Dataset):  # type: ignore[type-arg]
    """``n`` samples, object ``<i>`` of bucket ``data`` each, read with boto3 (a client made
    once a process, at its first sample), then 5 ms of other work."""

    def __init__(self, url: str, n: int = 32) -> None:
        self.url, self.n = url, n
        self._client = None

    def __len__(self) -> int:
        return self.n

    def __getstate__(self) -> dict:  # type: ignore[type-arg]
        return {**self.__dict__, "_client": None}  # a client is not sent to a worker

    def __getitem__(self, i: int) -> torch.Tensor:
        if self._client is None:
            self._client = _s3(self.url)
        data = self._client.get_object(Bucket="data", Key=str(i))["Body"].read()
        time.sleep(0.005)
        return torch.tensor([len(data), data[0]])


class S3fsObjects(S3Objects):
    """``S3Objects``' samples read through s3fs (``cat_file``: a HEAD and a GET an object, on
    fsspec's IO thread over aiohttp; its filesystem made once a process)."""

    def __getitem__(self, i: int) -> torch.Tensor:
        if self._client is None:
            self._client = s3fs.S3FileSystem(
                key="testing", secret="testing", endpoint_url=self.url,
                client_kwargs={"region_name": "us-east-1"}, skip_instance_cache=True,
            )  # fmt: skip
        data = self._client.cat_file(f"data/{i}")
        time.sleep(0.005)
        return torch.tensor([len(data), data[0]])


class _Server(ThreadingHTTPServer):
    """A listen backlog an object store's front end would have: socketserver's 5 drops the
    connections of 2 workers x 8 requests in flight made at once, which then wait for the
    client's retry (about 1 s)."""

    request_queue_size = 128


@contextmanager
def server() -> Iterator[str]:
    """A server on 127.0.0.1 for the block; yields its base URL."""
    srv = _Server(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/"
    finally:
        srv.shutdown()
        srv.server_close()


class Remote(Dataset):  # type: ignore[type-arg]
    """``n`` samples, each fetched from ``url`` (``client``: ``urllib``, ``requests``, ``pool``:
    urllib on a helper thread, ``fsspec``: its HTTP filesystem, ``fsspec-stream``: a file it
    streams), then ``work_s`` of other work (a local decode), outside the fetch."""

    def __init__(self, url: str, n: int = 32, client: str = "urllib", work_s: float = 0.005):
        self.url, self.n, self.client, self.work_s = url, n, client, work_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.client == "pool":  # fetched on a helper thread, as a pool would
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(1) as pool:
                data = pool.submit(_get, self.url + str(i)).result()
        elif self.client == "requests":
            import requests

            data = requests.get(self.url + str(i), timeout=30).content
        elif self.client == "fsspec":  # aiohttp on fsspec's IO thread, as HF streaming reads
            data = fsspec.filesystem("http").cat_file(self.url + str(i))
        elif self.client == "fsspec-stream":  # a streamed file: its request made at open
            with fsspec.open(self.url + str(i), block_size=0) as f:
                data = f.read()
        else:
            with urllib.request.urlopen(self.url + str(i), timeout=30) as r:
                data = r.read()
        time.sleep(self.work_s)
        return torch.tensor([len(data), data[0]])


class Batched(Remote):
    """``Remote``'s samples, a batch's fetched in one request (``__getitems__``: the
    ``dominant-stage`` fetch fix, objects that hold a batch), then ``work_s`` a sample."""

    def __getitems__(self, indices: list[int]) -> list[torch.Tensor]:
        data = _get(f"{self.url}many/{indices[0]}/{len(indices)}")
        out = []
        for k in range(len(indices)):
            body = data[k * BODY : (k + 1) * BODY]
            time.sleep(self.work_s)
            out.append(torch.tensor([len(body), body[0]]))
        return out


class Pooled(Remote):
    """``Remote``'s samples, a batch's fetched by a pool of ``flying`` threads (``__getitems__``:
    that many requests in flight a worker), then ``work_s`` a sample."""

    def __init__(self, url: str, n: int, flying: int, work_s: float = 0.005) -> None:
        super().__init__(url, n, "urllib", work_s)
        self.flying = flying

    def __getitems__(self, indices: list[int]) -> list[torch.Tensor]:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(self.flying) as pool:
            bodies = list(pool.map(_get, [self.url + str(i) for i in indices]))
        out = []
        for body in bodies:
            time.sleep(self.work_s)
            out.append(torch.tensor([len(body), body[0]]))
        return out


class Objects(IterableDataset):  # type: ignore[type-arg]
    """``Remote``'s ``n`` samples as objects of ``k`` samples each, one request an object (the
    what-if's "objects of k samples a request": shards of that size); each worker streams its
    own objects (``i % workers``), then ``work_s`` a sample."""

    def __init__(self, url: str, n: int, k: int, work_s: float = 0.005) -> None:
        self.url, self.n, self.k, self.work_s = url, n, k, work_s

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[torch.Tensor]:
        info = get_worker_info()
        me, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        for first in range(me * self.k, self.n, workers * self.k):
            k = min(self.k, self.n - first)
            data = _get(f"{self.url}many/{first}/{k}")
            for j in range(k):
                body = data[j * BODY : (j + 1) * BODY]
                time.sleep(self.work_s)
                yield torch.tensor([len(body), body[0]])


class Cached(Remote):
    """``Remote``, each body kept in ``folder`` once fetched and read from there after: the
    ``fetch-cache`` finding's fix, as a user would write it."""

    def __init__(self, url: str, folder: str, n: int = 32, work_s: float = 0.005) -> None:
        super().__init__(url, n, "urllib", work_s)
        self.folder = folder

    def __getitem__(self, i: int) -> torch.Tensor:
        import os

        path = os.path.join(self.folder, str(i))
        if not os.path.exists(path):
            data = _get(self.url + str(i))
            with open(path + ".part", "wb") as f:
                f.write(data)
            os.replace(path + ".part", path)
        with open(path, "rb") as f:
            data = f.read()
        time.sleep(self.work_s)
        return torch.tensor([len(data), data[0]])


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.read()  # type: ignore[no-any-return]


class Local(Dataset):  # type: ignore[type-arg]
    """The near miss: the same samples and work from a local file, no network (``client``:
    ``open``, or ``fsspec``: ``fsspec.open`` of its ``file://`` URL)."""

    def __init__(self, path: str, n: int = 32, client: str = "open") -> None:
        self.path, self.n, self.client = path, n, client

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        opened = fsspec.open("file://" + self.path) if self.client == "fsspec" else None
        with opened if opened is not None else open(self.path, "rb") as f:
            data = f.read()
        time.sleep(0.005)
        return torch.tensor([len(data), data[0]])
