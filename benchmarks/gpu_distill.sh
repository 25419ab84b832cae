#!/usr/bin/env bash
# Issue 37's distillation study (benchmarks/experiments/distill_bible.py --device cuda) on a lent GPU, in one call:
#   OUT=<folder> [PLAN=teachers|all] bash benchmarks/gpu_distill.sh [SECONDS]
# Lanes share the one GPU, each a `distill_bible --only NAME` process started once the files it needs exist:
#   teacher A; teacher B once teacher A's tokenizer is written (an ensemble needs one vocabulary); the distillation
#   (the teachers' beam-4 translation of the 29,024 training sources) once both teachers are done, stopped after its
#   dataset stage (PLAN=teachers, the default: both students then train at home, on the CPU, by the same study
#   command without --stop_after) or after the student's training (PLAN=all, which also trains the student on the
#   original data on the GPU). The int8 exports need ctranslate2, which the device image lacks: they always run at
#   home (`deepnmt distill` resumes at its export stage).
# Measured 2026-11-27 on an H200 (benchmarks/gpu_logs/2026-11-27-h200-distill-lanes.log): three quickstart-size
# trainings at once ran 15-22 steps/s each, so 8400 steps take ~8 min; PLAN=all does not fit one 15-minute lease.
# After SECONDS (default 540) whatever still runs is stopped and what exists comes back under OUT: each run's folder
# as <name>.tgz, without checkpoints when the run is complete and with its newest checkpoint when it is not (so that
# the study command continues it: `deepnmt train --resume_from_checkpoint last`), a file over 15 MB split into
# <name>.tgz.partNN; the lanes' logs and the study's entries as logs.tgz. A lane whose inputs can no longer appear
# (their lane ended without them) stops too. The study's folder is the same absolute path on the device and at home
# (distill.json records the teachers' paths):
#   mkdir -p /tmp/distill_bible_gpu && cd /tmp/distill_bible_gpu && for f in OUT/*.tgz; do tar xzf "$f"; done
#   for p in OUT/*.tgz.part00; do cat "${p%00}"* | tar xz; done
# Wheels of packages the device image lacks (datasets, evaluate, dill, multiprocess, fsspec; pyarrow, installed only
# when datasets does not import with the image's) travel in .whl/ (/work/.library/device/README.md).
set -u
OUT=${OUT:?set OUT to the folder that comes back}
BUDGET=${1:-540}
PLAN=${PLAN:-teachers}
WORK=${WORK:-/tmp/distill_bible_gpu}
STUDY_OPTIONS=${STUDY_OPTIONS:---teacher_steps 8400 --teacher_dropout 0.1 --teacher_warmup_steps 400 --student_steps 8400 --student_dropout 0.1 --translate_batch_size 512}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
begun=$(date +%s)
site=/tmp/site
mkdir -p "$site" "$WORK" "$OUT"
wheels=()
for wheel in .whl/*.whl; do [ -f "$wheel" ] && [[ $wheel != .whl/pyarrow-* ]] && wheels+=("$wheel"); done
[ ${#wheels[@]} -gt 0 ] && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target "$site" "${wheels[@]}"
ln -sfn "$PWD/training" "$site/hf_deepnmt_training"
ln -sfn "$PWD/model_cards" "$site/hf_deepnmt_model_cards"
export PYTHONPATH="$site:$PWD"
if ! python3 -c "import datasets" 2>/dev/null && compgen -G ".whl/pyarrow-*.whl" >/dev/null; then
  # datasets wants a newer pyarrow than the image's: the carried one
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/pyarrow-*.whl
fi
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1;
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__,
'cuda', torch.cuda.is_available())
import datasets, pyarrow; print('datasets', datasets.__version__, 'pyarrow', pyarrow.__version__)"; } 2>&1 | tee "$OUT/device.txt"

export WORK STUDY_OPTIONS DEVICE=${DEVICE:-cuda} THREADS=${THREADS:-2}
declare -A lane_of=()
lanes=()
# lane NAME [OPTION ...] [-- FILE ...]: `distill_bible --only NAME OPTION ...` once every FILE exists; it gives up
# when the lanes of PRODUCERS (pids, a variable set by the caller) have all ended and a FILE is still missing
lane() {
  local name=$1 options=()
  shift
  while [ $# -gt 0 ] && [ "$1" != -- ]; do options+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  # shellcheck disable=SC2016,SC2086  # the script is bash -c's; STUDY_OPTIONS is a list of options
  PRODUCERS="${PRODUCERS:-}" setsid bash -c '
    for f in "${@:2}"; do
      until [ -s "$f" ]; do
        alive=0; for pid in $PRODUCERS; do kill -0 "$pid" 2>/dev/null && alive=1; done
        [ $alive = 1 ] || { [ -s "$f" ] || { echo "gave up: $f will not be written"; exit 3; }; }
        sleep 2
      done
    done
    sleep 2
    exec python3 -m benchmarks.experiments.distill_bible --device "$DEVICE" --work_dir "$WORK" --threads "$THREADS" \
      $STUDY_OPTIONS --only $1' lane "$name ${options[*]}" "$@" >"$WORK/lane-$name.log" 2>&1 &
  lanes+=("$!")
  lane_of[$name]=$!
}
tokenizer=("$WORK/teacher-a/tokenizer.json" "$WORK/teacher-a/tokenizer_config.json")
lane teacher-a
PRODUCERS=${lane_of[teacher-a]} lane teacher-b -- "${tokenizer[@]}"
stop_after=dataset
if [ "$PLAN" = all ]; then
  PRODUCERS=${lane_of[teacher-a]} lane original-student -- "${tokenizer[@]}"
  stop_after=train
fi
PRODUCERS="${lane_of[teacher-a]} ${lane_of[teacher-b]}" lane distilled-student --stop_after $stop_after \
  -- "$WORK/teacher-a/metrics.json" "$WORK/teacher-b/metrics.json"

running() { for pid in "${lanes[@]}"; do kill -0 "$pid" 2>/dev/null && return 0; done; return 1; }
while running && [ $(( $(date +%s) - begun )) -lt "$BUDGET" ]; do
  sleep 5
  printf '%s s: %s\n' $(( $(date +%s) - begun )) "$(cd "$WORK" && ls -d teacher-a teacher-b student-original \
    distill/student 2>/dev/null | while read -r d; do printf '%s[%s] ' "$d" "$(ls -d "$d"/checkpoint-* 2>/dev/null \
    | sed 's/.*checkpoint-//' | sort -n | tail -1)"; done)"
done
for pid in "${lanes[@]}"; do kill -- -"$pid" 2>/dev/null; done
sleep 5
echo "stopped after $(( $(date +%s) - begun )) s"

# what comes back: every run's folder; an unfinished training's newest checkpoint with it
cd "$WORK" || exit 1
newest() { ls -d "$1"/checkpoint-* 2>/dev/null | sort -t- -k2 -n | tail -1; }
pack() {  # NAME FOLDER COMPLETE(0/1) [THE FOLDER OF ITS CHECKPOINTS]
  local name=$1 folder=$2 complete=$3 checkpoint
  tar cf "$name.tar" --exclude='checkpoint-*' "$folder"
  checkpoint=$(newest "${4:-$folder}")
  [ "$complete" = 0 ] && [ -n "$checkpoint" ] && tar rf "$name.tar" "$checkpoint"
  gzip -c "$name.tar" >"$OUT/$name.tgz" && rm "$name.tar"
  if [ "$(stat -c %s "$OUT/$name.tgz")" -gt 15000000 ]; then  # one file that comes back holds 16 MiB at most
    split -b 15000000 -d "$OUT/$name.tgz" "$OUT/$name.tgz.part" && rm "$OUT/$name.tgz"
  fi
}
for folder in teacher-a teacher-b student-original; do
  [ -d "$folder" ] && pack "$folder" "$folder" "$([ -s "$folder/metrics.json" ] && echo 1 || echo 0)"
done
if [ -d distill ]; then
  trained=$(python3 -c "import json; print(int('train' in json.load(open('distill/distill.json'))['completed']))" \
    2>/dev/null || echo 0)
  pack distill distill "$trained" distill/student
fi
tar czf "$OUT/logs.tgz" entries ./*.log 2>/dev/null
ls -la "$OUT"
for log in "$WORK"/*.log; do echo "== $log"; tail -c 600 "$log"; echo; done
