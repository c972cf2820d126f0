#!/usr/bin/env bash
# Builds .venv with pipeprof (editable), torch and torchvision, and the test tools.
#   bash dev/setup.sh        # library, torch extra, dev tools
#   bash dev/setup.sh test   # the same, plus what the test suite drives (tensorflow, chromium)
# Safe to run again: it installs only what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
pip() { .venv/bin/python -m pip "$@"; }

if ! .venv/bin/python -c "import torch, torchvision" >/dev/null 2>&1; then
  # A matched pair: torchvision's compiled ops load only against the torch it was built with.
  # Some machines (ours) hold this pair in a local index, so nothing is downloaded there; a plain
  # torch build that pip might prefer (a +cpu wheel in a local folder) fails torchvision's import.
  echo "installing torch and torchvision (first time: a few minutes) ..."
  pip install -q torch==2.14.1 torchvision==0.29.1
fi
pip install -q -e ".[dev]" 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -c "import pipeprof, torchvision" || { echo "setup failed"; exit 1; }

if [ "${1:-}" = "test" ]; then
  pip install -q -e ".[test]" 2>&1 | grep -v "^WARNING: Location" || true
  # s3fs (tests/test_fetch.py) on its own, pinned with the boto3 whose botocore its aiobotocore
  # allows: unpinned, pip backtracked through boto3's releases for 4 to over 10 minutes
  pip install -q "s3fs==2026.9.0" "aiobotocore==3.10.0" "boto3==1.43.117" 2>&1 \
    | grep -v "^WARNING: Location" || true
  # Debian's chromium: tests/test_html_browser.py opens the HTML report in it, headless.
  if [ ! -x /usr/bin/chromium ]; then
    echo "installing chromium (apt-get) for the HTML report test ..."
    SUDO=""
    [ "$(id -u)" = 0 ] || SUDO="sudo"
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  fi
fi

# A .pyc that pip wrote short (a disk that filled for a moment) fails every import of its module
# from then on, and nothing rewrites it here (PYTHONDONTWRITEBYTECODE): once after each change
# to what is installed, import what the suite drives, rebuilding any .pyc that cannot be read.
site=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
key="${1:-dev} $(ls -d "$site"/*.dist-info | md5sum | cut -c1-32)"
if [ "$(cat .venv/.imports-checked 2>/dev/null)" != "$key" ]; then
  mods=(torchvision torch rich psutil)
  [ "${1:-}" = "test" ] && mods+=(lightning transformers transformers.trainer accelerate
    tensorflow keras datasets torchdata h5py boto3 moto.server s3fs webdataset fsspec aiohttp
    nbclient ipykernel)
  log=$(mktemp)
  TF_CPP_MIN_LOG_LEVEL=3 .venv/bin/python dev/check_imports.py "${mods[@]}" 2>"$log" \
    || { cat "$log"; echo "setup failed"; exit 1; }
  rm -f "$log"
  echo "$key" > .venv/.imports-checked
fi
