"""tests/fixtures/soak.py: the soaks' small size unless EXACTLY_SOAK asks for the full one."""

from __future__ import annotations

import pytest

from tests.fixtures.soak import SOAK_ENV, full_size, soak


@pytest.mark.parametrize(("value", "full"), [(None, False), ("", False), ("0", False), ("1", True)])
def test_the_full_size_only_when_asked(
    monkeypatch: pytest.MonkeyPatch, value: str | None, full: bool
) -> None:
    if value is None:
        monkeypatch.delenv(SOAK_ENV, raising=False)
    else:
        monkeypatch.setenv(SOAK_ENV, value)
    assert full_size() is full
    assert soak(2, 3) == (3 if full else 2)
