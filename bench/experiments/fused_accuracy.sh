#!/usr/bin/env bash
# FB15k-237 DistMult with sampled negatives, trained three ways on one GPU: the fused step with float32
# scores, with bfloat16 scores, and the autograd step. Prints each run's filtered test metrics and time.
#   bash bench/experiments/fused_accuracy.sh [FB15K_DIR]
set -euo pipefail
DATA=${1:-.data/fb15k-237}
COMMON="dataset.path=$DATA training.device=cuda model.decoder=distmult model.dim=200 model.reg_weight=0
        training.batch_size=10000 training.num_chunks=10 training.num_negatives=1000
        training.degree_fraction=0.5 training.epochs=60 evaluation.every=0"
for variant in "training.fused_step=true training.score_dtype=float32" \
               "training.fused_step=true training.score_dtype=bfloat16" \
               "training.fused_step=false training.score_dtype=float32"; do
  echo "== $variant"
  run_dir=$(mktemp -d)
  ( time python -m marius_py.cli train fb15k-237 $COMMON $variant --run-dir "$run_dir" ) 2>&1 \
    | grep -E "^test|^real|^epoch 60: loss" | tail -3
  rm -rf "$run_dir"
done
