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

Not covered: clients with their own HTTP stack (``aiohttp``, which fsspec's HTTP and s3fs use;
``httpx``; gRPC). Their time stays in the stage that calls them.
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
    frame, t0 = open_stage("fetch")
    out = b""
    try:
        out = PIPES.orig["read"](self, *args, **kwargs)
        return out  # type: ignore[no-any-return]
    finally:
        _inside.on = False
        ns = close_stage(frame, t0)
        try:
            first = self not in _HOSTS
            if first:
                _HOSTS[self] = _pipe_host(self)
        except TypeError:  # not weakly referable: every read counts as a body's
            first = False
        if first:  # the stream's first bytes: its request's latency (the command's start too)
            _count(self, ns, None)
            _count(self, 0, len(out))
        else:
            _count(self, ns, len(out))


def _pipe_host(pipe: Any) -> str:
    """The ``host:port`` a shard stream's command reads from (``curl ... URL``), else
    ``"pipe"`` (a ``pipe:`` command pipeprof cannot read a host from)."""
    from urllib.parse import urlsplit

    cmd = pipe.args[0][0] if pipe.args and pipe.args[0] else None
    words = cmd.split() if isinstance(cmd, str) else list(cmd or ())
    for word in words:
        if isinstance(word, str) and word.startswith(("http://", "https://")):
            url = urlsplit(word)
            port = url.port or (443 if url.scheme == "https" else 80)
            return f"{url.hostname}:{port}"
    return "pipe"


def _wds_pipe() -> Any:
    module = sys.modules.get("webdataset.gopen")
    return None if module is None else module.Pipe


def _count(obj: Any, ns: int, nbytes: int | None) -> None:
    """One request (``nbytes`` None: its latency) or body read, into this thread's sink."""
    c0 = clock()
    try:
        host = _host(obj)
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
