#!/usr/bin/env bash
# Set up cape from scratch in ./.venv: torch's CPU wheel first (any other torch requirement
# would pull gigabytes of CUDA packages), then the package with its test and plot extras.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check "torch==2.13.0"
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[test,plot]"
echo "cape is installed in $(pwd)/.venv"
