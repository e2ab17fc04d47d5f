"""Shared fixtures."""

import os

import pytest


def pytest_sessionstart(session: pytest.Session) -> None:
    """CI sets RLSLICE_REQUIRE_TORCH=1: the torch tests (the `app` backend's offloader, the
    GRPO example's bit-identical run) must run there, never skip because torch is missing."""
    if os.environ.get("RLSLICE_REQUIRE_TORCH") == "1":
        try:
            import torch  # noqa: F401
        except ImportError as error:
            pytest.exit(f"RLSLICE_REQUIRE_TORCH=1 but torch does not import: {error}", 3)
