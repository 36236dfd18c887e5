#!/usr/bin/env bash
# Rebuild the Fashion-MNIST zoo runs and the precise-BN/EMA experiment, one after another
# (2 CPU cores: never two trainings at once; MPICH busy-polls). Finished steps are skipped,
# interrupted ones resume. Exports (zoo/*.npz, zoo.json) are separate: see zoo/README.md.
#   scripts/build_zoo.sh            # ~11 h on a quiet 2-core CPU (6 of them the three full-resolution runs)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
CFG=configs/fmnist_resnet20.py

train() {  # train OUTPUT_DIR [launcher...] -- overrides...
  local out=$1; shift
  # final.npz / latest.npz; runs of older basebn versions wrote final.pkl / latest.pkl
  if [ -f "$out/final.npz" ] || [ -f "$out/final.pkl" ]; then echo "skip $out (final checkpoint exists)"; return 0; fi
  local resume=(); { [ -f "$out/latest.npz" ] || [ -f "$out/latest.pkl" ]; } && resume=(--resume)
  echo "$(date +%T) train $out"
  "$@" output_dir="$out" "${resume[@]}" >> "$out.log" 2>&1 || echo "$(date +%T) FAILED $out (see $out.log)"
}

mkdir -p runs
train runs/fmnist_r20_s42 $PY -m basebn.train $CFG seed=42 model_ema.enabled=False bn.efficient_conv_bn_eval=False
train runs/fmnist_r20_ema_s43 $PY -m basebn.train $CFG seed=43
[ -s runs/precise_bn_ema_table.txt ] ||
  $PY experiments/precise_bn_ema_table.py --seeds 42 43 44 > runs/precise_bn_ema_table.txt 2>> runs/precise_bn_ema_table.log
train runs/fmnist_r20_syncbn2_s42 .venv/bin/mpiexec -n 2 $PY -m basebn.train $CFG seed=42 model.norm=SyncBN \
  batch_size=64 solver.basic_lr=0.05 model_ema.enabled=False
train runs/fmnist_finetune $PY -m basebn.train configs/fmnist_finetune.py
# a third seed for the baseline, and EMA with a shorter window (0.998 averages ~1 of 3 epochs and lags)
train runs/fmnist_r20_ema99_s44 $PY -m basebn.train $CFG seed=44 model_ema.momentum=0.99
# the longest run: 8 epochs, EMA 0.995
train runs/fmnist_r20_long_s42 $PY -m basebn.train configs/fmnist_resnet20_long.py seed=42
# full 28x28 resolution (stem stride 1), 7 epochs, ~2 h
train runs/fmnist_r20_fullres_s42 $PY -m basebn.train configs/fmnist_resnet20_fullres.py seed=42
# a second cosine cycle from the exported zoo:fmnist_r20_fullres (export it first, see zoo/README.md), ~2 h
train runs/fmnist_r20_fullres_restart_s42 $PY -m basebn.train configs/fmnist_resnet20_fullres_restart.py seed=42
# a third cycle from zoo:fmnist_r20_fullres_restart (export it first), ~2 h: zoo:fmnist_r20_fullres_restart2, 93.63%
train runs/fmnist_r20_fullres_restart2_s42 $PY -m basebn.train configs/fmnist_resnet20_fullres_restart.py seed=42 \
  model.weights=zoo:fmnist_r20_fullres_restart
# the second family: MobileNetV2 x0.5 at 56 px, 18 epochs, ~50 min: zoo:fmnist_mbnetv2_x050
train runs/fmnist_mbnetv2 $PY -m basebn.train configs/fmnist_mbnetv2.py
echo "$(date +%T) done"
