"""A Prometheus endpoint for long jobs (docs/live.md#a-metrics-endpoint): the live view's figures
(NOTE [ The live view ] in collect/live.py) served in Prometheus' text format, with rank and
loader labels, read when the endpoint is scraped (nothing runs between scrapes).

``pipeprof run --metrics-port N`` or ``Profiler(metrics_port=N)`` serves ``/metrics`` on
127.0.0.1:N (``HOST:N`` to bind elsewhere, ``0.0.0.0:N`` for every interface); a distributed
rank serves on N + its local rank, so that ranks on one host do not collide. Needs
``prometheus_client`` (``pip install 'pipeprof[prometheus]'``).
"""

from __future__ import annotations

import os
import sys
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from pipeprof.collect import ranks
from pipeprof.collect.live import LiveFigures

MIB = 2**20


def parse_address(text: str) -> tuple[str, int]:
    """``N`` or ``HOST:N`` as (host, port); ValueError saying what to write."""
    host, _, port = text.rpartition(":")
    try:
        number = int(port)
    except ValueError:
        number = -1
    if not 0 < number < 65536:
        raise ValueError(f"--metrics-port takes a port (9100) or HOST:PORT (0.0.0.0:9100), "
                         f"got {text!r}")  # fmt: skip
    return host or "127.0.0.1", number


class MetricsServer:
    """The endpoint (module docstring): a prometheus_client collector over the loaders."""

    def __init__(self, address: str, loaders: Callable[[], list[Any]],
                 gpu: Callable[[], list[tuple[Any, Any]]] | None = None) -> None:  # fmt: skip
        self.host, port = parse_address(address)
        rank = ranks.current()
        self.port = port + (rank.local_rank or 0)
        self.rank = str(rank.rank)
        self.loaders = loaders
        self.gpu = gpu
        self._figures: dict[int, LiveFigures] = {}
        self._server: Any = None
        self._thread: Any = None

    def start(self) -> None:
        """Serve; ImportError (what to install) or OSError (the port) where it cannot."""
        try:
            import prometheus_client
        except ImportError as exc:
            raise ImportError("--metrics-port needs prometheus_client: pip install "
                              "'pipeprof[prometheus]'") from exc  # fmt: skip
        registry = prometheus_client.CollectorRegistry(auto_describe=False)
        registry.register(self)  # type: ignore[arg-type]
        self._server, self._thread = prometheus_client.start_http_server(
            self.port, addr=self.host, registry=registry)  # fmt: skip
        _SERVING.add(self._server)  # a forked worker closes its copy of the socket


    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=5)
            self._server = None

    def collect(self) -> Iterator[Any]:
        """The metrics, read now (a scrape)."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        keys = ["rank", "loader"]
        g = {name: GaugeMetricFamily(f"pipeprof_{name}", text, labels=keys)
             for name, text in (
                 ("samples_per_second", "the loop's samples per second over the last 5 s"),
                 ("wait_fraction", "the share of the last 5 s the loop waited for a batch"),
                 ("starved_fraction", "... of which the batch was not ready"),
                 ("epoch", "passes over the loader so far"),
                 ("limiting_stage_share", "the leaf stage with the most time so far: its share"),
             )}  # fmt: skip
        steps = CounterMetricFamily("pipeprof_steps", "batches the loop has taken", labels=keys)
        stage = GaugeMetricFamily("pipeprof_limiting_stage", "the leaf stage with the most time "
                                  "so far (1)", labels=[*keys, "stage"])  # fmt: skip
        worker = GaugeMetricFamily("pipeprof_worker_cpu_fraction",
                                   "a DataLoader worker's CPU share over the last scrape",
                                   labels=[*keys, "worker"])  # fmt: skip
        fig: dict[str, Any] = {}
        for loader in list(self.loaders()):
            label = str(((loader.session.meta.get("run_loader") or {}).get("label"))
                        or "loader")  # fmt: skip
            live = self._figures.get(id(loader))
            if live is None:
                live = self._figures[id(loader)] = LiveFigures(_one(loader), self.gpu)
            fig = live.tick()
            at = [self.rank, label]
            for name, value in (("samples_per_second", fig["samples_per_s"]),
                                ("wait_fraction", fig["wait_share"]),
                                ("starved_fraction", fig["starved_share"]),
                                ("epoch", fig["epoch"])):  # fmt: skip
                if value is not None:
                    g[name].add_metric(at, value)
            steps.add_metric(at, fig["steps"])
            if fig["stage"]:
                stage.add_metric([*at, fig["stage"]["path"]], 1)
                g["limiting_stage_share"].add_metric(at, fig["stage"]["share"])
            for w in fig["workers"]:
                if w["cpu"] is not None:
                    worker.add_metric([*at, str(w["id"])], w["cpu"])
        yield from (*g.values(), steps, stage, worker)
        yield from self._machine(fig)

    def _machine(self, fig: dict[str, Any]) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        host = fig.get("host")
        if host:
            cpu = GaugeMetricFamily("pipeprof_host_cpu_fraction", "the host's CPU in use",
                                    labels=["rank"])  # fmt: skip
            cpu.add_metric([self.rank], host["cpu"])
            mem = GaugeMetricFamily("pipeprof_host_memory_used_bytes", "the host's memory in "
                                    "use", labels=["rank"])  # fmt: skip
            mem.add_metric([self.rank], host["mem_used_mb"] * MIB)
            yield from (cpu, mem)
        gpus = fig.get("gpu") or []
        if gpus:
            util = GaugeMetricFamily("pipeprof_gpu_utilization", "a GPU's utilisation (0-1), "
                                     "NVML", labels=["rank", "gpu"])  # fmt: skip
            mem = GaugeMetricFamily("pipeprof_gpu_memory_used_bytes", "a GPU's memory in use, "
                                    "NVML", labels=["rank", "gpu"])  # fmt: skip
            for gpu in gpus:
                if gpu["util"] is not None:
                    util.add_metric([self.rank, str(gpu["index"])], gpu["util"] / 100)
                if gpu["mem_used_mb"] is not None:
                    mem.add_metric([self.rank, str(gpu["index"])], gpu["mem_used_mb"] * MIB)
            yield from (util, mem)


_SERVING: weakref.WeakSet[Any] = weakref.WeakSet()


def _close_in_child() -> None:
    """In a forked child (a DataLoader worker): the endpoints' listening sockets closed, so that
    a worker outliving the job does not hold the port, nor answer for it."""
    for server in list(_SERVING):
        try:
            server.socket.close()
        except OSError:
            pass
    _SERVING.clear()


os.register_at_fork(after_in_child=_close_in_child)


def _one(loader: Any) -> Callable[[], list[Any]]:
    return lambda: [loader]


def serve(
    address: str | None,
    loaders: Callable[[], list[Any]],
    gpu: Callable[[], list[tuple[Any, Any]]] | None,
    notes: list[str],
) -> MetricsServer | None:
    """The endpoint started, or None (no address; or it could not start: said on stderr and in
    ``notes``, and the job goes on)."""
    if not address:
        return None
    server = MetricsServer(address, loaders, gpu)
    try:
        server.start()
    except (ImportError, OSError) as exc:
        said = f"the metrics endpoint did not start on {server.host}:{server.port}: {exc}"
        print(f"pipeprof: {said}", file=sys.stderr)
        notes.append(said)
        return None
    return server
