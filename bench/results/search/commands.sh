# Issue 42 item 3, session of 2026-11-29, one H200 (nvidia-h200): the FB15k-237 search, resumed over three calls
# (carry .runs .data .whl; .whl: zarr and optuna 5.0.0 with their needs; .runs/prefix.sh as in
# bench/results/plan/commands.sh). Three trials at once on the one GPU.
#   call 8 (2f20b74): trials 0-6 (the search finished; the retrain of best.yaml was cut by the call's limit)
#   call 9 (2f20b74): trials 7-9, all three pruned at epoch 10 by the median pruner, then best.yaml (trial 3:
#                     valid 0.3827) trained again: test MRR 0.3776
#   call 10 (d894f80, a trial is pruned from half its epochs on): trials 10-12, best.yaml (trial 10) trained
#                     again: call10-d894f80-fb15k-237.json; every trial: call10-d894f80-fb15k-237-trials.json
source .runs/prefix.sh
python bench/search.py --dataset fb15k-237 --config fb15k-237 --space bench/results/search/fb15k-237-space.yaml \
    --trials $TRIALS --devices cuda:0,cuda:0,cuda:0 --datasets-root .data --run-dir /tmp/tune/fb \
    --out $OUT/search-fb15k-237.json    # TRIALS=7, 10, 13
