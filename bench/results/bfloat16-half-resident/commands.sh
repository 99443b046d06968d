# Call 1 (nineteenth session): BETA and the default at half resident in bfloat16 (the memory of float32 8:2, 16:4, 32:8)
source .runs/prefix.sh
timeout 150 python -m pytest -m gpu -q -p no:cacheprovider tests/test_row_kernels_bfloat16.py tests/test_storage_dtype.py > $OUT/gpu-tests-kernels.log 2>&1
tail -2 $OUT/gpu-tests-kernels.log
b="--dataset .data/fb15k-237 --config fb15k-237 --set training.epochs=60"
go() { name=$1; shift; timeout 500 python bench/partition_accuracy.py $b "$@" --out $OUT/$name.json > $OUT/$name.log 2>&1 & }
bf="--set storage.dtype=bfloat16 --skip-p1 --variants"
go fb-p1
go fb-bf16-beta-8-4 $bf beta:8:4
go fb-bf16-beta-16-8 $bf beta:16:8
go fb-bf16-beta-32-16 $bf beta:32:16
go fb-bf16-default-8-4 $bf default:8:4
go fb-bf16-default-32-16 $bf default:32:16
b="--dataset .data/codex-m --config codex-m"
go cm-beta $bf beta:8:4 beta:16:8 beta:32:16
go cm-default $bf default:8:4 default:16:8 default:32:16
go cm-p1
wait
for f in $OUT/*.log; do echo "[$f]"; grep -v "Warning\|warn" $f | grep "MRR\|Error\|error\|Traceback" | tail -4; done

# Call 2 (nineteenth session): plain BETA with edge-level assignment (same states and IO, each edge to a random
# state holding its bucket), float32 at a quarter resident and bfloat16 at half; the default's bfloat16 rows again
source .runs/prefix.sh
b="--dataset .data/fb15k-237 --config fb15k-237 --set training.epochs=60"
go() { name=$1; shift; timeout 520 python bench/partition_accuracy.py $b "$@" --out $OUT/$name.json > $OUT/$name.log 2>&1 & }
bf="--set storage.dtype=bfloat16 --skip-p1 --variants"
e="+storage.edge_assignment=edge"
go fb-p1
go fb-bf16-beta-8-4-edge $bf beta:8:4$e
go fb-bf16-beta-16-8-edge $bf beta:16:8$e
go fb-bf16-beta-32-16-edge $bf beta:32:16$e
go fb-f32-beta-16-4-edge --skip-p1 --variants beta:16:4$e
go fb-bf16-default-8-4 $bf default:8:4
go fb-bf16-default-32-16 $bf default:32:16
b="--dataset .data/codex-m --config codex-m"
go cm-beta-edge $bf beta:8:4$e beta:16:8$e beta:32:16$e
go cm-p1-f32-beta-edge --variants beta:8:2$e beta:16:4$e beta:32:8$e
wait
for f in $OUT/*.log; do echo "[$f]"; grep -v "Warning\|warn" $f | grep "MRR\|Error\|error\|Traceback" | tail -4; done
cd $OUT && tar czf call.tgz *.json *.log && rm -f *.json *.log

# Call 3 (nineteenth session, at 9bb7011): the negative cache 0.1 in bfloat16 at half resident, beside BETA and the default
source .runs/prefix.sh
timeout 120 python -m pytest -m gpu -q -p no:cacheprovider tests/test_negative_cache.py > $OUT/gpu-tests-cache.log 2>&1
tail -2 $OUT/gpu-tests-cache.log
b="--dataset .data/fb15k-237 --config fb15k-237 --set training.epochs=60"
go() { name=$1; shift; timeout 520 python bench/partition_accuracy.py $b "$@" --out $OUT/$name.json > $OUT/$name.log 2>&1 & }
bf="--set storage.dtype=bfloat16 --skip-p1 --variants"
c="+storage.negative_cache=0.1"
e="+storage.edge_assignment=edge"
go fb-p1
go fb-bf16-beta-8-4-cache $bf beta:8:4$c
go fb-bf16-beta-16-8-cache $bf beta:16:8$c
go fb-bf16-beta-32-16-cache $bf beta:32:16$c
go fb-bf16-default-8-4-cache $bf default:8:4$c
go fb-bf16-default-16-8-cache $bf default:16:8$c
go fb-bf16-default-32-16-cache $bf default:32:16$c
go fb-bf16-beta-16-8-edge-cache $bf beta:16:8$e$c
b="--dataset .data/codex-m --config codex-m"
go cm-beta-cache $bf beta:8:4$c beta:16:8$c beta:32:16$c
go cm-default-cache $bf default:8:4$c default:16:8$c default:32:16$c
go cm-p1
wait
for f in $OUT/*.log; do echo "[$f]"; grep -v "Warning\|warn" $f | grep "MRR\|Error\|error\|Traceback" | tail -4; done
cd $OUT && tar czf call.tgz *.json *.log && rm -f *.json *.log

# Call 4 (nineteenth session): two-level orderings at half resident in bfloat16 whose IO is within 10% of BETA's
# (comet:P:C:K = P logical partitions of K physical ones, C logical in the buffer)
source .runs/prefix.sh
b="--dataset .data/fb15k-237 --config fb15k-237 --set training.epochs=60"
go() { name=$1; shift; timeout 540 python bench/partition_accuracy.py $b "$@" --out $OUT/$name.json > $OUT/$name.log 2>&1 & }
bf="--set storage.dtype=bfloat16 --skip-p1 --variants"
go fb-p1
go fb-bf16-comet-8-4-8 $bf comet:8:4:8
go fb-bf16-comet-16-8-4 $bf comet:16:8:4
go fb-bf16-comet-16-8-2 $bf comet:16:8:2
go fb-bf16-comet-32-16-2 $bf comet:32:16:2
go fb-bf16-comet-8-4-4 $bf comet:8:4:4
b="--dataset .data/codex-m --config codex-m"
go cm-comet-a $bf comet:8:4:8 comet:16:8:4 comet:8:4:4
go cm-comet-b $bf comet:16:8:2 comet:32:16:2
go cm-p1
wait
for f in $OUT/*.log; do echo "[$f]"; grep -v "Warning\|warn" $f | grep "MRR\|Error\|error\|Traceback" | tail -4; done
cd $OUT && tar czf call.tgz *.json *.log && rm -f *.json *.log

# Call 5 (nineteenth session): seed 1 of the FB15k-237 rows that carry the conclusions
source .runs/prefix.sh
b="--dataset .data/fb15k-237 --config fb15k-237 --set training.epochs=60 --set training.seed=1"
go() { name=$1; shift; timeout 540 python bench/partition_accuracy.py $b "$@" --out $OUT/$name.json > $OUT/$name.log 2>&1 & }
bf="--set storage.dtype=bfloat16 --skip-p1 --variants"
go s1-fb-p1
go s1-fb-bf16-default-8-4 $bf default:8:4
go s1-fb-bf16-default-32-16 $bf default:32:16
go s1-fb-bf16-comet-8-4-8 $bf comet:8:4:8
go s1-fb-bf16-comet-16-8-4 $bf comet:16:8:4
go s1-fb-bf16-comet-32-16-2 $bf comet:32:16:2
go s1-fb-bf16-beta-8-4-edge $bf beta:8:4+storage.edge_assignment=edge
wait
for f in $OUT/*.log; do echo "[$f]"; grep -v "Warning\|warn" $f | grep "MRR\|Error\|error\|Traceback" | tail -4; done
cd $OUT && tar czf call.tgz *.json *.log && rm -f *.json *.log
