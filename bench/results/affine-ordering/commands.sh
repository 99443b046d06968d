# Call 6 (nineteenth session, at the affine commit): does training each partition in fewer states close the gap?
# affine:P:C:K = P logical partitions (P = C^2) of K physical ones; float32 at a quarter (two seeds), bfloat16 at an eighth (half the IO)
source .runs/prefix.sh
b="--dataset .data/fb15k-237 --config fb15k-237 --set training.epochs=60"
go() { name=$1; shift; timeout 560 python bench/partition_accuracy.py $b "$@" --out $OUT/$name.json > $OUT/$name.log 2>&1 & }
go fb-p1
go fb-default-16-4 --skip-p1 --variants default:16:4
go fb-affine-16-4-4 --skip-p1 --variants affine:16:4:4
go fb-bf16-default-32-4 --set storage.dtype=bfloat16 --skip-p1 --variants default:32:4
go fb-bf16-affine-64-8-2 --set storage.dtype=bfloat16 --skip-p1 --variants affine:64:8:2
go s1-fb-p1 --set training.seed=1
go s1-fb-default-16-4 --set training.seed=1 --skip-p1 --variants default:16:4
go s1-fb-affine-16-4-4 --set training.seed=1 --skip-p1 --variants affine:16:4:4
b="--dataset .data/codex-m --config codex-m"
go cm-a --variants default:16:4 affine:16:4:4
go cm-b --skip-p1 --variants default:32:4 affine:64:8:2
wait
for f in $OUT/*.log; do echo "[$f]"; grep -v "Warning\|warn" $f | grep "MRR\|Error\|error\|Traceback" | tail -4; done
cd $OUT && tar czf call.tgz *.json *.log && rm -f *.json *.log

# Call 7 (nineteenth session, at 6a342bb): GPU tests of the changed parts; a third seed of affine against the
# default at a quarter; affine's automatic layout at an eighth (64:8; split in 4 as 256:32, lowered by
# fit_comet_split so the nodes fill every partition: FB15k-237 128:16 in groups of 2, CoDEx-M 192:24 in groups of 3)
source .runs/prefix.sh
b="--dataset .data/fb15k-237 --config fb15k-237 --set training.epochs=60"
go() { name=$1; shift; timeout 560 python bench/partition_accuracy.py $b "$@" --out $OUT/$name.json > $OUT/$name.log 2>&1 & }
go s2-fb-p1 --set training.seed=2
go s2-fb-default-16-4 --set training.seed=2 --skip-p1 --variants default:16:4
go s2-fb-affine-16-4 --set training.seed=2 --skip-p1 --variants default:16:4+storage.ordering=affine
go fb-bf16-affine-64-8 --set storage.dtype=bfloat16 --skip-p1 --variants default:64:8+storage.ordering=affine
b="--dataset .data/codex-m --config codex-m"
go cm-affine-64-8 --variants default:64:8+storage.ordering=affine
timeout 400 python -m pytest -m gpu -q -p no:cacheprovider tests/test_negative_cache.py tests/test_storage_dtype.py \
    tests/test_out_of_core.py tests/test_training.py tests/test_pipeline.py tests/test_fused_step.py > $OUT/gpu-tests.log 2>&1
tail -2 $OUT/gpu-tests.log
wait
for f in $OUT/*.log; do echo "[$f]"; grep -v "Warning\|warn" $f | grep "MRR\|Error\|error\|Traceback\|passed\|failed" | tail -4; done
cd $OUT && tar czf call.tgz *.json *.log && rm -f *.json *.log

# Call 8 (nineteenth session, at b123ecc, after the review fixes): the negative cache's GPU tests (the bfloat16
# defer merge now rounds stochastically) and affine's automatic layout on the GPU (CoDEx-S, 5 epochs)
source .runs/prefix.sh
timeout 200 python -m pytest -m gpu -q -p no:cacheprovider tests/test_negative_cache.py tests/test_storage_dtype.py 2>&1 | tail -2
timeout 200 python bench/partition_accuracy.py --dataset .data/codex-s --config codex-s --set training.epochs=5 \
    --variants default:16:4+storage.ordering=affine default:16:4 --out $OUT/codex-s-affine.json 2>&1 | grep "MRR\|Error"

# Call 9 (nineteenth session, at 1ff1e9e): is affine's slower epoch the lookahead? A line change swaps C - 1 = 3
# groups and storage.lookahead=2 prefetches two. FB15k-237 16:4, 60 epochs, three processes at once.
source .runs/prefix.sh
b="--dataset .data/fb15k-237 --config fb15k-237 --set training.epochs=60 --skip-p1"
go() { name=$1; shift; timeout 500 python bench/partition_accuracy.py $b "$@" --out $OUT/$name.json > $OUT/$name.log 2>&1 & }
go default-16-4 --variants default:16:4
go affine-16-4-lookahead-2 --variants default:16:4+storage.ordering=affine
go affine-16-4-lookahead-3 --variants default:16:4+storage.ordering=affine+storage.lookahead=3
wait
for f in $OUT/*.log; do echo "[$f]"; grep -v "Warning\|warn" $f | grep "MRR\|Error\|error\|Traceback" | tail -2; done
cd $OUT && tar czf call.tgz *.json *.log && rm -f *.json *.log
