"""Fixtures for the operator's unit tests: example specs from minimal to everything on."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from op_fakes import FULL_SPEC


@pytest.fixture
def full_spec() -> dict[str, Any]:
    return copy.deepcopy(FULL_SPEC)


@pytest.fixture(params=["minimal", "full"])
def any_spec(request) -> dict[str, Any]:
    return {} if request.param == "minimal" else copy.deepcopy(FULL_SPEC)
