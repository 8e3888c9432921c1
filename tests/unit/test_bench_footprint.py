"""The footprint benchmark (bench/footprint.py): memory counted over a process tree, and the page written from the
measurements by its template."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import jinja2
import pytest
from castad_contracts import topology

from bench import footprint


def test_a_process_trees_memory_counts_its_childrens():
    alone = footprint.tree_rss_mb(os.getpid())
    holder = "import time; block = bytearray(80 * 2**20); print('held', flush=True); time.sleep(30)"
    with subprocess.Popen([sys.executable, "-c", holder], stdout=subprocess.PIPE, text=True) as child:
        try:
            assert child.stdout is not None and child.stdout.readline() == "held\n"
            with_child = footprint.tree_rss_mb(os.getpid())
            assert footprint.tree_rss_mb(child.pid) >= 80
            assert with_child - alone >= 80
        finally:
            child.kill()
    time.sleep(0.1)
    assert footprint.tree_rss_mb(os.getpid()) < with_child - 60
    assert footprint.tree_rss_mb(2**22 + 1) == 0  # no such process: nothing


def _measured() -> dict:
    return {
        "facts": {"date": "2026-12-07 21:00 UTC", "cores": 2, "cpu": "test", "postgres": "15", "load": "0 / 0 / 0"},
        "starts": {service: {"ready_s": 1.25, "idle_mb": 100.4} for service in topology.SERVICES},
        "work": {service: {"after_mb": 200.6, "later_mb": 150.2} for service in topology.SERVICES},
    }


def test_the_page_shows_every_service_started_alone_and_after_work():
    page = footprint.render(_measured())
    for service in topology.SERVICES:
        assert f"| {service} | 1.25 s | 100 MiB |" in page
        assert f"| {service} | 201 MiB | 150 MiB |" in page
    assert "2026-12-07 21:00 UTC" in page and "{{" not in page and "{%" not in page


def test_a_measurement_missing_from_the_kept_file_fails_the_page_instead_of_leaving_a_gap():
    measured = _measured()
    del measured["work"]["song"]
    with pytest.raises(jinja2.UndefinedError):
        footprint.render(measured)
