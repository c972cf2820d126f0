from __future__ import annotations

import threading

import pytest

# torchvision (through triton) segfaults on import once TensorFlow is loaded in the same process;
# importing it first keeps any selection of tests (-k, single files) safe.
import torchvision  # noqa: F401

from pipeprof.collect.torch import hangs
from pipeprof.core.recorder import recorder


@pytest.fixture(scope="session", autouse=True)
def own_machine_cache(tmp_path_factory):
    """The core-scaling probe's cache (collect/machine.py) in a folder of this test session's:
    the suite neither reads nor writes the user's ~/.cache, and measures the machine once."""
    mp = pytest.MonkeyPatch()
    mp.setenv("PIPEPROF_CACHE_DIR", str(tmp_path_factory.mktemp("pipeprof-cache")))
    yield
    mp.undo()


@pytest.fixture(autouse=True)
def nothing_leaks():
    """Every test leaves no sampler thread alive, no pass watched for hangs, and the recorder
    disabled and empty. The process's hang watcher thread lives on (NOTE [ Hangs ])."""
    before = {t.name for t in threading.enumerate()}
    watched = set(map(id, hangs.watching()))
    yield
    rec = recorder()
    assert not rec.enabled, "a profile left the recorder enabled"
    assert rec.innermost is None, "a profile left stages open"
    rec.raw.clear()
    leaked = [
        t.name
        for t in threading.enumerate()
        if t.name.startswith("pipeprof") and t.name not in before and t.name != "pipeprof-hangs"
    ]
    assert not leaked, f"sampler threads left running: {leaked}"
    left = [w for w in hangs.watching() if id(w) not in watched]
    assert not left, f"passes still watched for hangs: {len(left)}"


@pytest.hookimpl(tryfirst=True)  # before ``-m`` selects: it sees the ``serial`` marks added here
def pytest_collection_modifyitems(config, items):
    """Tests that build whole environments run last, so their load never overlaps a timing test.

    A ``timing`` test compares a measured duration with the truth its own code logged. On a shared
    virtual machine a burst of stolen CPU can push one run past its bound, so such a test gets two
    more tries, 15 s apart (a landing's CI once failed three tries 2 s apart, in a busy stretch of
    a few minutes); a wrong measurement fails all three. No other test is re-run: one that fails
    under load is made not to depend on it, or its cause is found, so that a new flaky test shows
    at once.

    Every ``timing`` test is also ``serial``: the README's test command runs the tests that are
    not three at a time (pytest-xdist), then the ``serial`` ones alone.
    """
    items.sort(key=lambda item: item.get_closest_marker("slow") is not None)
    for item in items:
        if item.get_closest_marker("timing") is not None:
            item.add_marker(pytest.mark.flaky(reruns=2, reruns_delay=15))
            item.add_marker(pytest.mark.serial)
