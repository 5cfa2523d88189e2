#!/usr/bin/env bash
# Set up cape from scratch in ./.venv: torch's CPU wheel first (any other torch requirement
# would pull gigabytes of CUDA packages), then the library with every extra: the lab, speech,
# translation, plots, the documentation site and the tests. It can be run again at any time.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
# Debian packages, installed only if missing: fonts for the rendered-character images
# (cape.lab.data.images); espeak-ng, WordNet, sox and libsndfile for the speech corpus
# (cape.lab.data.speech).
DEB_PACKAGES="fonts-dejavu-core fonts-dejavu-extra fonts-liberation2 fonts-freefont-ttf"
DEB_PACKAGES="$DEB_PACKAGES fonts-urw-base35"
DEB_PACKAGES="$DEB_PACKAGES espeak-ng libespeak-ng1 wordnet-base sox libsndfile1"
# Apertium English->Spanish and fortune cookies for the translation corpus
# (cape.lab.data.translation).
DEB_PACKAGES="$DEB_PACKAGES apertium apertium-eng-spa fortunes-min fortunes"
# The King James Bible and the Jargon File for the text corpora of the causal language models
# (cape.lab.data.text_corpus; the fortunes above are a third).
DEB_PACKAGES="$DEB_PACKAGES bible-kjv dict-jargon"
missing=$(for p in $DEB_PACKAGES; do dpkg -s "$p" >/dev/null 2>&1 || echo "$p"; done)
if [ -n "$missing" ]; then
  SUDO=$([ "$(id -u)" -eq 0 ] || echo sudo)
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing >/dev/null
fi
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
# torchvision (timm's dependency, for the tests of cape.integrations.timm) pinned to the torch
# it matches, so that resolving timm never replaces the CPU torch; its PyPI wheel is a CUDA
# build whose C ops do not load here (tests/conftest.py lets it import without them)
.venv/bin/python -m pip install -q --disable-pip-version-check "torch==2.13.0" "torchvision==0.28.0"
EXTRAS="lab,speech,translation,plot,docs,test"
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[$EXTRAS]"
echo "cape is installed in $(pwd)/.venv"
