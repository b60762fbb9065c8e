"""Shared fixtures: real model files are fetched (not skipped) through the registry."""
import os
from pathlib import Path

# Tiny numpy matmuls in the oracles: a multithreaded BLAS only spin-waits on a 2-core machine.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import signal

import pytest

REPO = Path(__file__).resolve().parents[1]

# Ctrl-C is part of what the suite tests (tests/test_lifetimes.py, the CLI on a pty). A runner
# that starts it as a background job of a non-interactive shell (`cmd &`) hands it SIGINT
# ignored: Python then installs no handler, _thread.interrupt_main() does nothing, and every
# child inherits the ignore. The suite runs with Python's own handler, whoever started it.
if signal.getsignal(signal.SIGINT) in (signal.SIG_IGN, signal.SIG_DFL, None):
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def smollm_path():
    from pydecode.registry import model_path

    return model_path("smollm2-135m")


@pytest.fixture(scope="session")
def gemma_path():
    from pydecode.registry import model_path

    return model_path("gemma3-270m")
