#!/usr/bin/env bash
# The README's pictures, made from a real run: the demo script (2,048 images) under
# `pipeprof run`, its terminal summary kept as text and its HTML report shot in headless
# Chromium.
#
#   bash dev/setup.sh test && bash dev/screenshot.sh      # writes docs/img/, ~30 s
#
# PIPEPROF_CHROMIUM names another Chromium binary.
set -euo pipefail
cd "$(dirname "$0")/.."
out=docs/img
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# the verdict and summary pipeprof prints on stderr, as a terminal 100 columns wide shows it
COLUMNS=100 .venv/bin/pipeprof run --out "$tmp/run.json" --html "$tmp/report.html" \
  examples/train.py --images 2048 > /dev/null 2> "$tmp/stderr.txt"
cp "$tmp/stderr.txt" "$out/summary.txt"
chromium=${PIPEPROF_CHROMIUM:-/usr/bin/chromium}
"$chromium" --headless --no-sandbox --disable-gpu --hide-scrollbars --no-first-run \
  --disable-background-networking --window-size=1000,1500 \
  --screenshot="$PWD/$out/report.png" "file://$tmp/report.html" > /dev/null 2>&1
.venv/bin/python dev/live_screen.py "$out/live.txt"  # the live panel, mid-run
echo "wrote $out/summary.txt, $out/report.png and $out/live.txt"
