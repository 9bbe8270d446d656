"""Real-browser checks of the HTML reports: Debian's chromium driven by the Python `playwright` package.

No browser download: `.ci/run` installs chromium with apt and playwright drives that binary. A missing
chromium FAILS the tests that use it (a report nobody opened in a browser is not tested).

Use it from a test module::

    from tests.browser import open_page  # noqa: F401  (a pytest fixture)

    def test_x(open_page, tmp_path):
        opened = open_page(tmp_path / "report.html")
        opened.assert_clean()

`open_page` launches a fresh chromium (a new, empty profile in the test's tmp dir, no network services)
and records what the page did: console errors, uncaught exceptions, dialogs (an `alert()` is an XSS) and
every request whose URL is neither `file:` nor `data:` (the reports must work offline).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
VIEWPORT = {"width": 1280, "height": 800}
LOCAL_SCHEMES = ("file:", "data:", "about:", "blob:")


@dataclass
class OpenedPage:
    page: object
    """playwright.sync_api.Page (typed loosely: playwright is a test-only dependency)."""
    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    """URLs of requests that would leave the machine (neither file: nor data:)."""

    def assert_clean(self) -> None:
        assert self.console_errors == [], self.console_errors
        assert self.page_errors == [], self.page_errors
        assert self.dialogs == [], f"a dialog fired (script ran from the input?): {self.dialogs}"
        assert self.requests == [], f"the page made network requests: {self.requests}"

    def screenshot(self, path: Path, full_page: bool = False) -> Path:
        self.page.screenshot(path=str(path), full_page=full_page)  # type: ignore[attr-defined]
        return path


def require_chromium() -> None:
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (apt-get install chromium); "
                    "the browser tests never download a browser", pytrace=False)
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        pytest.fail("the Python package `playwright` is missing: pip install -e '.[test]'", pytrace=False)


def _record(opened: OpenedPage, context: object) -> None:
    def on_console(msg: object) -> None:
        if msg.type == "error":  # type: ignore[attr-defined]
            opened.console_errors.append(msg.text)  # type: ignore[attr-defined]

    def on_request(req: object) -> None:
        url = req.url  # type: ignore[attr-defined]
        if not url.startswith(LOCAL_SCHEMES):
            opened.requests.append(url)

    def on_dialog(dialog: object) -> None:
        opened.dialogs.append(f"{dialog.type}: {dialog.message}")  # type: ignore[attr-defined]
        dialog.dismiss()  # type: ignore[attr-defined]

    page = opened.page
    page.on("console", on_console)  # type: ignore[attr-defined]
    page.on("pageerror", lambda exc: opened.page_errors.append(str(exc)))  # type: ignore[attr-defined]
    page.on("dialog", on_dialog)  # type: ignore[attr-defined]
    context.on("request", on_request)  # type: ignore[attr-defined]


@pytest.fixture
def open_page(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[Path], OpenedPage]]:
    """``open_page(path)`` loads a local HTML file in a fresh headless chromium at 1280x800 and waits
    until it has loaded; the browser closes at the end of the test."""
    require_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")), executable_path=str(CHROMIUM), headless=True,
            args=ARGS, viewport=VIEWPORT, offline=True,
        )

        def load(path: Path) -> OpenedPage:
            opened = OpenedPage(context.new_page())
            _record(opened, context)
            opened.page.goto(path.resolve().as_uri(), wait_until="load")  # type: ignore[attr-defined]
            return opened

        try:
            yield load
        finally:
            context.close()
