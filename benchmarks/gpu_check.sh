#!/usr/bin/env bash
# The checks of a lent GPU machine in one call (benchmarks/RESULTS.md, sections `gpu` and `gpu_dtmt`):
#   OUT=<folder> bash benchmarks/gpu_check.sh [SECTIONS]
# Runs from a copy of the repository on the device: installs the wheels carried in .whl/ (packages the device image
# lacks, e.g. datasets) into /tmp/site, measures the benchmark SECTIONS (default gpu_dtmt) merged into a copy of
# benchmarks/results.json under $OUT/bench, then the GPU tests (pytest -m gpu tests/test_gpu.py), logs under $OUT.
set -u
OUT=${OUT:?set OUT to the folder that comes back}
SECTIONS=${1:-gpu_dtmt}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
site=/tmp/site
mkdir -p "$site" "$OUT/bench"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl
fi
ln -sfn "$PWD/training" "$site/hf_deepnmt_training"
ln -sfn "$PWD/model_cards" "$site/hf_deepnmt_model_cards"
export PYTHONPATH="$site:$PWD"
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv;
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"; } \
  2>&1 | tee "$OUT/device.txt"
cp benchmarks/results.json benchmarks/RESULTS.md "$OUT/bench/"
timeout 330 python3 -m benchmarks.run --sections "$SECTIONS" --merge --out-dir "$OUT/bench" 2>&1 | tee "$OUT/bench.log"
rm -f "$OUT/bench/scaling.png"
timeout 240 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider -o addopts="" 2>&1 | tee "$OUT/gpu-tests.log"
