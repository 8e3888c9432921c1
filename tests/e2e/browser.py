"""Debian's chromium driven by playwright, for the console's tests.

Kept off the network, every console error and uncaught exception of the page collected, so that a test fails on any
of them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
from collections.abc import Iterator

import pytest
from castad_local import REPO_ROOT
from playwright.sync_api import Browser, ConsoleMessage, Page, sync_playwright

CHROMIUM = pathlib.Path("/usr/bin/chromium")
# Headless, no sandbox (tests run as root), and nothing of chromium's own reaching out to the network.
FLAGS = [
    "--no-sandbox",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-default-apps",
    "--disable-domain-reliability",
    "--metrics-recording-only",
]
# The console's pictures: into var/console, so that a test run leaves the tree clean; `make screenshots` points
# CASTAD_SCREENSHOTS_DIR at docs/console to refresh the ones the docs show.
SCREENSHOTS = pathlib.Path(os.environ.get("CASTAD_SCREENSHOTS_DIR", REPO_ROOT / "var" / "console"))
VIEWPORT = {"width": 1280, "height": 860}
PHONE = {"width": 390, "height": 844}  # a phone held upright


@dataclasses.dataclass
class Console:
    """A page of the console and what went wrong on it."""

    page: Page
    base_url: str
    errors: list[str] = dataclasses.field(default_factory=list)
    allowed: list[str] = dataclasses.field(default_factory=list)

    def allow(self, fragment: str) -> None:
        """A console error the test provokes on purpose (a refused key's 401) is no failure."""
        self.allowed.append(fragment)

    def record(self, message: ConsoleMessage) -> None:
        if message.type in ("error", "warning") and not any(f in message.text for f in self.allowed):
            self.errors.append(f"{message.type}: {message.text} ({message.location.get('url')})")

    def open(self, route: str = "") -> None:
        self.page.goto(f"{self.base_url}/ui/{route}")

    def screenshot(self, name: str) -> None:
        """Write the page's picture into SCREENSHOTS, then check that it fits a phone."""
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)
        self.fits_a_phone(name)

    def fits_a_phone(self, name: str) -> None:
        """At a phone's width nothing on the page scrolls sideways (a wide table scrolls in its own box)."""
        self.page.set_viewport_size(PHONE)
        try:
            width = self.page.evaluate("() => document.documentElement.scrollWidth")
        finally:
            self.page.set_viewport_size(VIEWPORT)
        assert width <= PHONE["width"], f"the {name} page is {width} px wide on a {PHONE['width']} px phone"

    def log_in(self, key: str, actor: str = "e2e-operator") -> None:
        self.page.get_by_test_id("login-key").fill(key)
        self.page.get_by_test_id("login-actor").fill(actor)
        self.page.get_by_test_id("login-submit").click()


@contextlib.contextmanager
def launched() -> Iterator[Browser]:
    """Debian's chromium, headless; a failure (never a skip) when it is not installed."""
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: as root run `apt-get install chromium` (make setup does it when root)")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=FLAGS)
        try:
            yield launched
        finally:
            launched.close()


def console_page(browser: Browser, base_url: str, language: str = "en-GB") -> Console:
    """A fresh browser context (its own sessionStorage) with a page collecting console errors."""
    context = browser.new_context(viewport=VIEWPORT, locale=language)  # type: ignore[arg-type]
    page = context.new_page()
    console = Console(page, base_url)
    page.on("console", console.record)
    page.on("pageerror", lambda error: console.errors.append(f"uncaught: {error}"))
    return console
