"""Shared fixtures: real model files are fetched (not skipped) through the registry."""
import os
from pathlib import Path

# Tiny numpy matmuls in the oracles: a multithreaded BLAS only spin-waits on a 2-core machine.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def smollm_path():
    from pydecode.registry import model_path

    return model_path("smollm2-135m")


@pytest.fixture(scope="session")
def gemma_path():
    from pydecode.registry import model_path

    return model_path("gemma3-270m")
