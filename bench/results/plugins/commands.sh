# Issue 52's GPU figures, session of 2026-12-07, one H100 (nvidia-h200 asked; the device gave an H100 80GB HBM3).
# The measured tree: `git archive 1e4cfe2` in .head; the parent of issue 52: `git archive 65cea0a` in .base;
# .data holds ../shared/datasets/{fb15k-237,codex-s}; .runs/prefix.sh as in bench/results/plan/commands.sh.
source .runs/prefix.sh
cd .head
python bench/plugins.py --dataset ../.data/fb15k-237 --device cuda --epochs 3 --json $OUT/plugins-gpu-fb15k-237.json
E2E="--placements device host --dims 100 --decoders complex distmult --score-dtypes float32"
python bench/e2e.py $E2E --workdir /tmp/e2e-new --json $OUT/e2e-current.json            # call18-1e4cfe2-d100.json
(cd ../.base && python bench/e2e.py $E2E --workdir /tmp/e2e-base --json $OUT/e2e-base.json)  # call18-base-65cea0a-d100.json
python bench/quality.py --runs fb15k-237:fb15k-237 --datasets-root ../.data --out $OUT/quality-fb15k-237.json &
python -m pytest -q -m gpu tests/test_runners.py tests/test_plugins.py tests/test_research_api.py \
    tests/test_fused_step.py tests/test_training.py     # gpu-tests-1e4cfe2.log

# Issue 53, same session, call 19 (one H100): commits written behind training (54f8a48 in .head) against its
# parent df0971a (.base), d=400 GPU tables, 5 epochs, default commit points:
E2E="--placements device --dims 400 --decoders complex --score-dtypes float32 --epochs 5 --seconds 4"
(cd .head && python bench/e2e.py $E2E --workdir /tmp/e2e-new --json $OUT/e2e53-current.json)  # call19-54f8a48-*
(cd .base && python bench/e2e.py $E2E --workdir /tmp/e2e-base --json $OUT/e2e53-base.json)    # call19-base-df0971a-*
