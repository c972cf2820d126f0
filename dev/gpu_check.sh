#!/usr/bin/env bash
# The GPU checks on a GPU machine (docs/gpu.md), in the two calls the device tool allows:
#   bash dev/gpu_check.sh truth   # benchmarks/gpu_truth.py, then the demo on cuda (~6 min)
#   bash dev/gpu_check.sh tests   # the test suite with the GPU visible (at most 9 min)
# Run from the repository root. Results go under $OUT (default ./gpu-check). It uses the
# machine's python3 (torch, rich, psutil, nvidia-ml-py, h5py and pytest) with pipeprof not
# installed: PYTHONPATH is the repository root, absolute, as tests run pipeprof in other folders.
set -u
out=${OUT:-gpu-check}
mkdir -p "$out"
export PYTHONPATH="$PWD"
case "${1:-}" in
  truth)
    nvidia-smi > "$out/nvidia-smi.txt" 2>&1
    timeout -s INT -k 15 420 python3 benchmarks/gpu_truth.py --out "$out" > "$out/gpu_truth.txt" 2>&1
    echo "gpu_truth rc=$?"
    timeout -s INT -k 15 120 python3 -m pipeprof demo --device cuda -o "$out/demo.json" \
      --html "$out/demo.html" > "$out/demo.txt" 2>&1
    echo "demo rc=$?"
    tail -c 6000 "$out/gpu_truth.txt"
    ;;
  tests)
    # test_this_machine_has_no_gpu skips here, saying the stand-ins are not the truth here.
    # Without pytest-timeout and pytest-rerunfailures there, timing tests are not re-run.
    # No Chromium there: the browser test is skipped on purpose. Tests of what else is missing
    # (the notebook, MLflow, W&B, TensorFlow) skip themselves, naming it (-rs lists them).
    export PIPEPROF_SKIP_BROWSER=1
    timeout -s INT -k 15 540 python3 -m pytest -q -p no:cacheprovider -rfEs \
      > "$out/pytest.txt" 2>&1
    echo "pytest rc=$?"
    tail -n 60 "$out/pytest.txt"
    ;;
  *)
    echo "usage: bash dev/gpu_check.sh truth|tests" >&2
    exit 2
    ;;
esac
