"""idempotent.testing.browser: finding Chromium, and the clear error where it cannot be installed."""

from __future__ import annotations

import shutil

import pytest

from idempotent.testing import browser


def test_an_installed_chromium_is_returned() -> None:
    path = browser.chromium()
    assert shutil.which(path) is not None


def test_missing_chromium_without_root_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(browser.shutil, "which", lambda name: None)
    monkeypatch.setattr(browser.os, "geteuid", lambda: 1000)
    with pytest.raises(RuntimeError, match="install Debian's 'chromium' package"):
        browser.chromium()
