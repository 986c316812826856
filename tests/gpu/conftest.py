"""GPU tests: every test here is marked ``gpu`` and skipped where CUDA is absent."""

from __future__ import annotations

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "tests/gpu/" in item.nodeid.replace("\\", "/"):
            item.add_marker(pytest.mark.gpu)
            if not torch.cuda.is_available():
                item.add_marker(skip)


@pytest.fixture(params=["triton", "cute"])
def backend(request) -> str:
    """Each kernel backend in turn; one that is not installed here is skipped, not failed."""
    from dash_cuda.backends import get_backend

    reason = get_backend(request.param).missing()
    if reason:
        pytest.skip(f"backend {request.param!r}: {reason}")
    return request.param
