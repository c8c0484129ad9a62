"""Headless Chromium for page tests: Debian's /usr/bin/chromium (scripts/setup.sh installs it)
driven by Python playwright, a fresh profile each time and nothing fetched from the network."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from playwright.sync_api import Page

CHROMIUM = Path("/usr/bin/chromium")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
VIEWPORT = {"width": 1100, "height": 900}


@contextmanager
def chromium_page(javascript: bool = True) -> Iterator[Page]:
    """A page of a headless Chromium with a fresh `--user-data-dir`, closed afterwards;
    `javascript=False`: pages run no script at all."""
    from playwright.sync_api import sync_playwright

    if not CHROMIUM.is_file():
        raise RuntimeError(f"{CHROMIUM} missing: run `make setup` (apt-get install chromium)")
    with tempfile.TemporaryDirectory(prefix="chromium-") as profile, sync_playwright() as pw:
        browser = pw.chromium.launch_persistent_context(
            profile,
            executable_path=str(CHROMIUM),
            headless=True,
            args=ARGS,
            viewport=VIEWPORT,
            java_script_enabled=javascript,
        )
        try:
            yield browser.new_page()
        finally:
            browser.close()
