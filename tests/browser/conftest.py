"""Fixtures of the browser tests: a JupyterLab server per test, one Chromium per module."""

from __future__ import annotations

import psutil
import pytest
from driver import CHROMIUM, CHROMIUM_ARGS, JupyterLab, collect_descendants


@pytest.fixture
def lab(tmp_path_factory):
    """A fresh server per test: no tab, workspace or kernel carried over from another test."""
    server = JupyterLab(tmp_path_factory.mktemp("jupyterlab"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    descendants: list[psutil.Process] = []
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            descendants = psutil.Process().children(recursive=True)
            chromium.close()
    # Chromium's helpers (crashpad, zygotes) outlive its main process and re-parent here once a
    # test made this process a subreaper.
    collect_descendants(descendants)


@pytest.fixture
def page(browser):
    # Tall enough that a whole final-check panel fits for its screenshot.
    context = browser.new_context(viewport={"width": 1200, "height": 2000})
    try:
        yield context.new_page()
    finally:
        context.close()


