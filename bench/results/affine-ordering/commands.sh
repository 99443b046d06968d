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
