#!/usr/bin/env bash
# The two commands of README.md, each self-contained on a fresh machine (Python 3.11 + pip):
#   bash run.sh quickstart   train + evaluate a deep Transformer on the embedded corpus, translate, write card/plots
#   bash run.sh test         run the test suite
# Both create (or reuse) a virtual environment in .venv, install torch first (the CPU wheel: a plain `torch`
# requirement would pull a multi-GB CUDA build), then this package with its dev, export, serve and convert extras (the
# export tests need CTranslate2 and ONNX Runtime, the server tests starlette and uvicorn, the conversion tests
# sentencepiece and sacremoses; `test` makes their absence a failure, not a skip).
set -euo pipefail
cd "$(dirname "$0")"
VENV="${DEEPNMT_VENV:-.venv}"
TORCH_SPEC="${DEEPNMT_TORCH:-torch==2.13.0}"

setup() {
  if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
  fi
  local py="$VENV/bin/python"
  "$py" -m pip install --quiet --disable-pip-version-check --upgrade pip
  if ! "$py" -c "import torch" >/dev/null 2>&1; then
    "$py" -m pip install --quiet --disable-pip-version-check "$TORCH_SPEC"
  fi
  "$py" -m pip install --quiet --disable-pip-version-check -e ".[dev,export,serve,convert]"
}

command="${1:-}"
shift || true
case "$command" in
  test)
    setup
    export HF_HUB_OFFLINE=1 DEEPNMT_REQUIRE_EXPORT=1 DEEPNMT_REQUIRE_SERVE=1 DEEPNMT_REQUIRE_CONVERT=1
    exec "$VENV/bin/python" -m pytest "$@"
    ;;
  quickstart)
    setup
    export HF_HUB_OFFLINE=1
    exec "$VENV/bin/deepnmt" quickstart "$@"
    ;;
  *)
    echo "usage: bash run.sh {quickstart|test} [args...]" >&2
    exit 2
    ;;
esac
