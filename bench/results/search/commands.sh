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

# Call 13 (449715a, session 2 of the figure): does FB15k-237 gain from more epochs, at the searched learning rate or a
# lower one? Three trainings of the shipped config at once on one H200 (.runs/call13.sh), 400 epochs asked, cut by
# the call's limit at 345-370; each run's metrics log: call13-449715a-fb15k-237-400-epochs-lr*-metrics.jsonl.
# Best validation MRR: lr 0.053 0.3847 (epoch 370; 0.3830 at 200), lr 0.035 0.3829 (310), lr 0.025 0.3792 (340).
source .runs/prefix.sh
for lr in 0.053 0.035 0.025; do
  timeout 500 python -m marius_py train fb15k-237 dataset.path=.data/fb15k-237 training.epochs=400 training.lr=$lr \
      --run-dir /tmp/r$lr > $OUT/fb-lr$lr.log 2>&1 &
done
wait

# Next (prepared, not yet run): the codex-m-best search for the >= 0.36 figure, resumed across calls as above
# (.runs/search-cm.sh: the FB15k-237 script with these arguments; keep its run directory's tgz between calls).
python bench/search.py --dataset codex-m --config codex-m-best --space bench/results/search/codex-m-best-space.yaml \
    --trials $TRIALS --devices cuda:0,cuda:0,cuda:0 --datasets-root .data --run-dir /tmp/tune/cm \
    --out $OUT/search-codex-m-best.json

# Session of 2026-11-29 (c17be03), one H200 (nvidia-h200; the 4-GPU kind was refused at the call):
# Call 15: the codex-m-best search, two trials at once on the one GPU, bfloat16 scores fixed, cut by its 540 s limit
# with five trials complete and two interrupted (every trial: call15-c17be03-codex-m-best-trials.json).
source .runs/prefix.sh
timeout 540 python bench/search.py --dataset codex-m --config codex-m-best --space bench/results/search/codex-m-best-space.yaml \
    --trials 40 --devices cuda:0,cuda:0 --set training.score_dtype=bfloat16 --datasets-root .data --run-dir /tmp/tune/cm \
    --out $OUT/search-codex-m-best.json
# Call 16: no new trials (--trials: the five finished), best.yaml trained again and tested (call16-*-codex-m-best.json),
# and codex-s as shipped beside it on the same GPU (call16-*-quality-codex-s.json).
python bench/quality.py --runs codex-s:codex-s --datasets-root .data --out $OUT/quality-codex-s.json &
python bench/search.py --dataset codex-m --config codex-m-best --space bench/results/search/codex-m-best-space.yaml \
    --trials 5 --devices cuda:0 --datasets-root .data --run-dir /tmp/tune/cm --out $OUT/search-codex-m-best.json
# Call 17: codex-m-best as shipped (float32 scores), alone on the GPU (call17-*-quality-codex-m-best.json).
python bench/quality.py --runs codex-m:codex-m-best --datasets-root .data --out $OUT/quality-codex-m-best.json
