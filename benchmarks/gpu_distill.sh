#!/usr/bin/env bash
# Issue 37's distillation study (benchmarks/experiments/distill_bible.py --device cuda) on a lent GPU, in one call:
#   OUT=<folder> bash benchmarks/gpu_distill.sh [SECONDS]
# Four lanes share the one GPU (each a `distill_bible --only` run, its own process): teacher A; teacher B and the
# student on the original data once teacher A's tokenizer is written (both use it); the distilled student (the
# teachers' translation of the training corpus, then its training) once both teachers are done. The lane stops
# `deepnmt distill` once the student's training is recorded: the int8 exports need ctranslate2, which the device
# image lacks, and run at home by the same study command (`deepnmt distill` resumes at its export stage). After
# SECONDS (default 540) whatever still runs is stopped and what exists comes back: each model folder without its
# checkpoints as OUT/<name>.tgz (the distilled student's newest checkpoint too when its training was cut short, so
# that the same command resumes it at home), the lanes' logs and the study's entries as OUT/logs.tgz.
# The study's folder is the same absolute path on the device and at home (distill.json records the teachers' paths):
#   mkdir -p /tmp/distill_bible_gpu && for f in OUT/*.tgz; do tar xzf $f -C /tmp/distill_bible_gpu; done
# Wheels of packages the device image lacks (datasets, evaluate, dill, multiprocess) travel in .whl/ (gpu_check.sh).
set -u
OUT=${OUT:?set OUT to the folder that comes back}
BUDGET=${1:-540}
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
# one lane: `distill_bible --only NAME` once the files named after it exist (its inputs)
lane() {  # NAME [EXTRA OPTION ...] -- [FILE ...]
  local name=$1 options=() files=()
  shift
  while [ $# -gt 0 ] && [ "$1" != -- ]; do options+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  files=("$@")
  # shellcheck disable=SC2086  # STUDY_OPTIONS is a list of options
  setsid bash -c 'for f in "${@:2}"; do until [ -s "$f" ]; do sleep 2; done; done; sleep 2
    exec python3 -m benchmarks.experiments.distill_bible --device "$DEVICE" --work_dir "$WORK" --threads "$THREADS" \
      $STUDY_OPTIONS --only $1' lane "$name ${options[*]}" "${files[@]}" >"$WORK/lane-$name.log" 2>&1 &
  lanes+=("$!")
}
lanes=()
tokenizer=("$WORK/teacher-a/tokenizer.json" "$WORK/teacher-a/tokenizer_config.json")
lane teacher-a
lane teacher-b -- "${tokenizer[@]}"
lane original-student -- "${tokenizer[@]}"
# the int8 exports need ctranslate2, missing on the device: the student's training is the lane's last stage here
lane distilled-student --stop_after train -- "$WORK/teacher-a/metrics.json" "$WORK/teacher-b/metrics.json"

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

# what comes back: model folders without checkpoints (one checkpoint of an unfinished distilled student)
cd "$WORK" || exit 1
for folder in teacher-a teacher-b student-original; do
  [ -d "$folder" ] && tar czf "$OUT/$folder.tgz" --exclude='checkpoint-*' "$folder"
done
if [ -d distill ]; then
  tar cf distill.tar --exclude='checkpoint-*' distill
  trained=$(python3 -c "import json; print('train' in json.load(open('distill/distill.json'))['completed'])" 2>/dev/null)
  newest=$(ls -d distill/student/checkpoint-* 2>/dev/null | sort -t- -k2 -n | tail -1)
  [ "$trained" != True ] && [ -n "$newest" ] && tar rf distill.tar "$newest"
  gzip -c distill.tar >"$OUT/distill.tgz" && rm distill.tar
  if [ "$(stat -c %s "$OUT/distill.tgz")" -gt 15000000 ]; then  # the limit of one file that comes back
    split -b 15000000 -d "$OUT/distill.tgz" "$OUT/distill.tgz.part" && rm "$OUT/distill.tgz"
  fi
fi
tar czf "$OUT/logs.tgz" entries ./*.log 2>/dev/null
ls -la "$OUT"
for log in "$WORK"/*.log; do echo "== $log"; tail -n 4 "$log"; done
