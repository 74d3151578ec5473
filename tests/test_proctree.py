"""gpudash.proctree against real process trees, and against psutil's full scan."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest

from gpudash import proctree

# A parent whose child has a child of its own, each sleeping until killed; the parent starts the child
# from a second thread (its children file is the thread's own).
TREE = """
import subprocess, sys, threading, time
inner = [sys.executable, "-c", "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"]
threading.Thread(target=lambda: subprocess.Popen(inner)).start()
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
time.sleep(60)
"""


@pytest.fixture
def tree():
    root = subprocess.Popen([sys.executable, "-c", TREE])
    deadline = time.monotonic() + 10
    while len(psutil.Process(root.pid).children(recursive=True)) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    yield root
    for p in psutil.Process(root.pid).children(recursive=True):
        p.kill()
    root.kill()
    root.wait()


@pytest.mark.parametrize("children_files", [True, False], ids=["proc-children-files", "psutil-fallback"])
def test_descendants_match_a_full_scan(tree, monkeypatch, children_files) -> None:
    if children_files and not proctree.CHILDREN_FILES:
        pytest.fail("this kernel lacks /proc/PID/task/TID/children; the walk cannot be tested here")
    monkeypatch.setattr(proctree, "CHILDREN_FILES", children_files)
    expected = {p.pid for p in psutil.Process(tree.pid).children(recursive=True)}
    assert len(expected) == 3
    assert sorted(proctree.descendants(tree.pid)) == sorted(expected)


def test_a_process_without_children_and_a_gone_one() -> None:
    leaf = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert proctree.descendants(leaf.pid) == []
    finally:
        leaf.kill()
        leaf.wait()
    assert proctree.descendants(leaf.pid) == []
