"""Network reads timed where they run: HTTP requests as the relative stage ``fetch``, apart from
local reads and decoding, with their bytes and latency by host. The user's code is not changed.

NOTE [ Timing network reads ]
Most Python clients that a dataset fetches with end in the standard library's ``http.client``:
``urllib.request``, ``requests`` and ``urllib3``, ``boto3``/``botocore`` (through urllib3). A
request passes through public methods of two public classes there:

1. ``HTTPConnection.getresponse()``: from the request sent to the response's headers read, the
   request's latency (the server's time to first byte, and the network's round trip);
2. ``HTTPResponse.read()`` and ``readinto()``: the body, as the client reads it (Python 3.10's
   ``read(n)`` calls ``readinto`` itself: the inner call is neither timed nor counted again);
3. WebDataset reads ``http(s)://`` shards through a ``curl`` process's pipe, not ``http.client``:
   its ``webdataset.gopen.Pipe.read`` (``PIPES``, once ``webdataset`` is imported). A
   stream is one request: its first read, the wait for the first bytes (curl's start included),
   is the latency; the later reads are the body.

pipeprof replaces those three on the classes, with functions that call the originals with the
same arguments and return what they return, in the processes and for the time that h5py's reads
are timed (NOTE [ Timing h5py reads ] in collect/hdf5.py: a worker's whole life; a pass in the
training process; counted installs). ``import torch`` imports ``http.client`` already, so a
spawned worker pays nothing to have it. Outside a profile's stages a call pays one function
call more (``piped`` in collect/patch.py).

Each call made inside the pipeline's stages (or on a helper thread while the pipeline thread is
in one) is the relative stage ``fetch`` (``load/fetch`` inside ``__getitem__``); a request the
training loop makes between batches (a logger's upload) is not timed. It is opened only where
the thread is not inside a ``fetch`` already (the user's own ``pipeprof.stage("fetch")``
times its calls then, which are still counted). What is counted, per host (``"host:port"``) in
the sink's aggregates (``counts(sink)["fetch"]``, bounded by the hosts, never by the requests):
requests, their latency's ns and a histogram of it (``LATENCY_BOUNDS_MS``: one count a bucket,
so workers' histograms add), body reads, their ns and bytes. The counting is pipeprof's own
time, detached from the enclosing stages and summed in ``cost_ns``.

NOTE [ fsspec's async filesystems ]
fsspec's HTTP filesystem (what Hugging Face ``datasets`` streams ``http(s)://`` files through)
and the other async ones (s3fs, gcsfs) run each request as a coroutine on fsspec's own IO thread,
over ``aiohttp``, while the thread that asked waits in ``fsspec.asyn.sync``:

    pipeline thread: load ... sync(loop, coroutine) ............................ load
                              |                      waits                    |
    fsspec's IO thread:       +-- ClientSession._request --+-- response.read --+
                                  latency (to the headers)    body (bytes)

4. ``fsspec.asyn.sync`` (and the HTTP module's own name for it) is the relative stage
   ``fetch`` on the thread that waits in it, as a request through ``http.client`` is;
5. ``aiohttp.ClientSession._request`` (its latency) and ``ClientResponse.read`` (the body, its
   bytes) are counted per host as 1 and 2 are, on the IO thread, where a stage of the pipeline
   thread is open. No stage is opened there: its requests interleave;
6. a streamed HTTP file's ``read`` (``HTTPStreamFile``, ``block_size=0``: its body comes
   through ``response.content``) is counted on the thread that waits in it.
7. an S3 object's body through aiobotocore (s3fs: ``AioStreamingBody.read``, which reads
   ``response.content``) is counted as 5's are.
A body another client streams through ``response.content`` is in the fetch's time, not counted
as a read.
8. fsspec's local files (``LocalFileOpener.read`` and ``readline``: ``file://`` URLs and plain
   paths through ``fsspec.open`` or a ``"file"`` filesystem) are no network: each read is the
   relative stage ``read`` (``load/read``), as an h5py read is, not counted per host.

Each is patched where its module is imported when the patches are installed: in the training
process at each pass; in a worker at its start, where ``fsspec`` is imported (its ``asyn``
module is imported then, once), and aiohttp's, aiobotocore's and the HTTP module's at the
worker's first wait in ``fsspec.asyn.sync`` if they were imported after (a filesystem made in
the worker; a request it made before that wait, through the HTTP module's own ``sync``, is not
timed).

Not covered: ``aiohttp`` used directly (no fsspec), ``httpx``, gRPC. Their time stays in the
stage that calls them.
"""

from __future__ import annotations

import bisect
import functools
import http.client as hc
import sys
import threading
import weakref
from typing import Any

from pipeprof.collect.patch import ClassPatch, close_stage, open_stage, piped
from pipeprof.core.recorder import clock, counts, recorder
from pipeprof.core.units import LATENCY_BOUNDS_MS

_BOUNDS_NS = [int(b * 1e6) for b in LATENCY_BOUNDS_MS]
_rec = recorder()
_inside = threading.local()  # a body read inside another (read(n) calls readinto)
_HOSTS: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()  # response -> host


def _patched(cls: str) -> Any:
    return getattr(hc, cls)


def _getresponse(self: Any) -> Any:
    if not piped():
        return _ORIG["getresponse"](self)
    frame, t0 = open_stage("fetch")
    try:
        resp = _ORIG["getresponse"](self)
    finally:
        ns = close_stage(frame, t0)
        _count(self, ns, None)
    try:
        _HOSTS[resp] = _host(self)
    except TypeError:  # not weakly referable: its reads count under "?"
        pass
    return resp


def _read(self: Any, amt: int | None = None) -> bytes:
    if getattr(_inside, "on", False) or not piped():
        return _ORIG["read"](self, amt)  # type: ignore[no-any-return]
    _inside.on = True
    frame, t0 = open_stage("fetch")
    out = b""
    try:
        out = _ORIG["read"](self, amt)
        return out  # type: ignore[no-any-return]
    finally:
        _inside.on = False
        ns = close_stage(frame, t0)
        _count(self, ns, len(out))


def _readinto(self: Any, b: Any) -> int:
    if getattr(_inside, "on", False) or not piped():
        return _ORIG["readinto"](self, b)  # type: ignore[no-any-return]
    _inside.on = True
    frame, t0 = open_stage("fetch")
    n: int = 0
    try:
        n = _ORIG["readinto"](self, b)
        return n
    finally:
        _inside.on = False
        ns = close_stage(frame, t0)
        _count(self, ns, n)


def _pipe_read(self: Any, *args: Any, **kwargs: Any) -> bytes:
    if getattr(_inside, "on", False) or not piped():
        return PIPES.orig["read"](self, *args, **kwargs)  # type: ignore[no-any-return]
    _inside.on = True
    try:
        return _timed_read(PIPES.orig["read"], self, args, kwargs, _count_pipe)
    finally:
        _inside.on = False


def _timed_read(orig: Any, obj: Any, args: Any, kwargs: Any, count: Any) -> bytes:
    """``orig(obj, *args, **kwargs)`` as the relative stage ``fetch``, then ``count(obj, ns,
    bytes read)``, failed or not."""
    frame, t0 = open_stage("fetch")
    out = b""
    try:
        out = orig(obj, *args, **kwargs)
        return out  # type: ignore[no-any-return]
    finally:
        count(obj, close_stage(frame, t0), out)


def _count_pipe(pipe: Any, ns: int, out: bytes) -> None:
    """A shard stream's read: its first is its request's latency (the command's start too)."""
    try:
        first = pipe not in _HOSTS
        if first:
            _HOSTS[pipe] = _pipe_host(pipe)
    except TypeError:  # not weakly referable: every read counts as a body's
        first = False
    if first:
        _count(pipe, ns, None)
        _count(pipe, 0, len(out))
    else:
        _count(pipe, ns, len(out))


def _pipe_host(pipe: Any) -> str:
    """The ``host:port`` a shard stream's command reads from (``curl ... URL``), else
    ``"pipe"`` (a ``pipe:`` command pipeprof cannot read a host from)."""
    cmd = pipe.args[0][0] if pipe.args and pipe.args[0] else None
    words = cmd.split() if isinstance(cmd, str) else list(cmd or ())
    for word in words:
        if isinstance(word, str) and word.startswith(("http://", "https://")):
            return _url_host(word)
    return "pipe"


def _url_host(url: Any) -> str:
    """``host:port`` of a URL (a str or a ``yarl.URL``), the scheme's port where it has none."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(str(url))
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return "?"
    return f"{parts.hostname}:{port}"


# In a worker (set by its WorkerInit): aiohttp and fsspec's HTTP module, imported after the
# worker's patches were installed (a dataset that makes its filesystem in the worker), are
# patched at the first wait, for the worker's life as the others are
LATE = [False]


def _waited(sync: Any, loop: Any, func: Any, args: Any, kwargs: Any) -> Any:
    if LATE[0]:
        _late()
    if not piped():
        return sync(loop, func, *args, **kwargs)
    frame, t0 = open_stage("fetch")
    try:
        return sync(loop, func, *args, **kwargs)
    finally:
        close_stage(frame, t0)


def _late() -> None:
    done = True
    for patch in (AIO, HTTP, BOTO):
        done = (patch.installed() or patch.install()) and done
    LATE[0] = not done


def _sync(loop: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
    return _waited(SYNC.orig["sync"], loop, func, args, kwargs)


def _http_sync(loop: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
    """fsspec's HTTP module calls its own name for ``sync`` (a streamed file's request)."""
    return _waited(HTTP.orig["sync"], loop, func, args, kwargs)


async def _request(self: Any, method: str, url: Any, *args: Any, **kwargs: Any) -> Any:
    if not piped():
        return await AIO.orig["_request"](self, method, url, *args, **kwargs)
    t0 = clock()
    try:
        return await AIO.orig["_request"](self, method, url, *args, **kwargs)
    finally:
        _count_at(_url_host(url), clock() - t0, None)


async def _body(self: Any) -> bytes:
    return await _counted(AIO.orig["read"], self, self)


async def _s3_body(self: Any, *args: Any, **kwargs: Any) -> bytes:
    """An S3 object's body through aiobotocore (s3fs): read from ``response.content``, not
    through ``ClientResponse.read``, so counted here (NOTE [ fsspec's async filesystems ], 7)."""
    return await _counted(BOTO.orig["read"], self, self._raw_stream, *args, **kwargs)


async def _counted(read: Any, obj: Any, response: Any, *args: Any, **kwargs: Any) -> bytes:
    """``read(obj, ...)``, a body read counted at the host of ``response.url``, where a stage
    of the pipeline's thread is open."""
    if not piped():
        return await read(obj, *args, **kwargs)  # type: ignore[no-any-return]
    t0 = clock()
    out = b""
    try:
        out = await read(obj, *args, **kwargs)
        return out  # type: ignore[no-any-return]
    finally:
        _count_at(_url_host(response.url), clock() - t0, len(out or b""))


def _stream_read(self: Any, *args: Any, **kwargs: Any) -> bytes:
    """A streamed HTTP file's read (``HTTPStreamFile``): its body, read through
    ``response.content``, counted here, on the thread that waits."""
    if not piped():
        return HTTP.orig["read"](self, *args, **kwargs)  # type: ignore[no-any-return]
    return _timed_read(HTTP.orig["read"], self, args, kwargs, _count_url)


def _count_url(f: Any, ns: int, out: bytes) -> None:
    _count_at(_url_host(f.url), ns, len(out or b""))


def _fsspec_asyn() -> Any:
    return sys.modules.get("fsspec.asyn")


def _fsspec_http(name: str | None = None) -> Any:
    module = sys.modules.get("fsspec.implementations.http")
    return module if name is None or module is None else getattr(module, name, None)


def _aiohttp(cls: str) -> Any:
    module = sys.modules.get("aiohttp")
    return None if module is None else getattr(module, cls, None)


def _aiobotocore_body() -> Any:
    module = sys.modules.get("aiobotocore.response")
    return None if module is None else getattr(module, "AioStreamingBody", None)


def _fsspec_local() -> Any:
    module = sys.modules.get("fsspec.implementations.local")
    return None if module is None else module.LocalFileOpener


def _local_read(self: Any, *args: Any, **kwargs: Any) -> Any:
    """A local file's read through fsspec: ``read``, not ``fetch`` (NOTE [ fsspec's async
    filesystems ], 8)."""
    return _read_local(LOCAL.orig["read"], self, args, kwargs)


def _local_readline(self: Any, *args: Any, **kwargs: Any) -> Any:
    return _read_local(LOCAL.orig["readline"], self, args, kwargs)


def _read_local(orig: Any, f: Any, args: Any, kwargs: Any) -> Any:
    if not piped():
        return orig(f, *args, **kwargs)
    frame, t0 = open_stage("read")
    try:
        return orig(f, *args, **kwargs)
    finally:
        close_stage(frame, t0)


def _wds_pipe() -> Any:
    module = sys.modules.get("webdataset.gopen")
    return None if module is None else module.Pipe


def _count(obj: Any, ns: int, nbytes: int | None) -> None:
    """One request (``nbytes`` None: its latency) or body read, into this thread's sink."""
    try:
        host = _host(obj)
    except Exception:  # counting must never break a read
        return
    _count_at(host, ns, nbytes)


def _count_at(host: str, ns: int, nbytes: int | None) -> None:
    """``_count`` for a request to ``host`` (``"host:port"``)."""
    c0 = clock()
    try:
        mine = counts(_rec.sink)
        found = mine.get("fetch")
        if found is None:
            found = mine["fetch"] = {}
        entry: dict[str, Any] | None = found.get(host)
        if entry is None:
            entry = found[host] = _entry()
        if nbytes is None:
            entry["requests"] += 1
            entry["latency_ns"] += ns
            entry["latency_hist"][bisect.bisect_left(_BOUNDS_NS, ns)] += 1
        else:
            entry["reads"] += 1
            entry["read_ns"] += ns
            entry["bytes"] += nbytes
    except Exception:  # counting must never break a read
        return
    cost = clock() - c0
    st = _rec._local.st
    if st.path is not None:  # pipeprof's own time: out of every enclosing stage
        st.detached += cost
    entry["cost_ns"] += cost


def _entry() -> dict[str, Any]:
    return {"requests": 0, "latency_ns": 0, "reads": 0, "read_ns": 0, "bytes": 0, "cost_ns": 0,
            "latency_hist": [0] * (len(_BOUNDS_NS) + 1)}  # fmt: skip


def _host(obj: Any) -> str:
    """``host:port`` of a connection, or of a response's (noted when it came: http.client
    keeps no link from a response to its connection) or a shard stream's (its command's URL)."""
    if not isinstance(obj, hc.HTTPConnection):  # a response, or a shard stream's pipe
        try:
            return _HOSTS.get(obj, "?")
        except TypeError:
            return "?"
    return f"{obj.host}:{obj.port}"


# http.client's requests (PATCH) and WebDataset's shard streams (PIPES: install is False while
# webdataset is not imported) timed in this process while installed (NOTE [ Timing network
# reads ]): NOTE [ Counted class patches ] in collect/patch.py. The originals, which ours call,
# in _ORIG and PIPES.orig.
PATCH = ClassPatch(
    [
        (functools.partial(_patched, "HTTPConnection"), "getresponse", _getresponse),
        (functools.partial(_patched, "HTTPResponse"), "read", _read),
        (functools.partial(_patched, "HTTPResponse"), "readinto", _readinto),
    ]
)
install, uninstall, installed = PATCH.install, PATCH.uninstall, PATCH.installed
_ORIG = PATCH.orig
PIPES = ClassPatch([(_wds_pipe, "read", _pipe_read)])
# fsspec's async filesystems (NOTE [ fsspec's async filesystems ]): each install is False while
# its module is not imported (aiohttp and fsspec's HTTP module: a worker patches them late, LATE)
SYNC = ClassPatch([(_fsspec_asyn, "sync", _sync)])
AIO = ClassPatch(
    [
        (functools.partial(_aiohttp, "ClientSession"), "_request", _request),
        (functools.partial(_aiohttp, "ClientResponse"), "read", _body),
    ]
)
HTTP = ClassPatch(
    [(_fsspec_http, "sync", _http_sync),
     (functools.partial(_fsspec_http, "HTTPStreamFile"), "read", _stream_read)]
)  # fmt: skip
BOTO = ClassPatch([(_aiobotocore_body, "read", _s3_body)])
LOCAL = ClassPatch(
    [(_fsspec_local, "read", _local_read), (_fsspec_local, "readline", _local_readline)]
)  # fmt: skip
