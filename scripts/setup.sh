#!/usr/bin/env bash
# Set up cape from scratch in ./.venv: torch's CPU wheel first (any other torch requirement
# would pull gigabytes of CUDA packages), then the package with its test and plot extras.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
# Debian packages, installed only if missing: fonts for the rendered-character images
# (cape.data.images); espeak-ng, WordNet, sox and libsndfile for the speech corpus (cape.data.speech).
DEB_PACKAGES="fonts-dejavu-core fonts-dejavu-extra fonts-liberation2 fonts-freefont-ttf fonts-urw-base35"
DEB_PACKAGES="$DEB_PACKAGES espeak-ng libespeak-ng1 wordnet-base sox libsndfile1"
# Apertium English->Spanish and fortune cookies for the translation corpus (cape.data.translation).
DEB_PACKAGES="$DEB_PACKAGES apertium apertium-eng-spa fortunes-min fortunes"
missing=$(for p in $DEB_PACKAGES; do dpkg -s "$p" >/dev/null 2>&1 || echo "$p"; done)
if [ -n "$missing" ]; then
  SUDO=$([ "$(id -u)" -eq 0 ] || echo sudo)
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing >/dev/null
fi
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check "torch==2.13.0"
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[test,plot,speech,translation]"
echo "cape is installed in $(pwd)/.venv"
