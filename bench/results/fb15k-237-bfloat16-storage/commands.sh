# Eighteenth session, call 1, one H100: the emulation of bfloat16 storage (bench/storage_precision.py).
source .runs/prefix.sh
b="--dataset .data/fb15k-237 --config fb15k-237 --set training.epochs=60"
go() { name=$1; shift; timeout 575 python bench/partition_accuracy.py $b "$@" --out $OUT/$name.json > /tmp/$name.log 2>&1 & }
go f32-p1
go f32-16-4 --skip-p1 --variants default:16:4
go f32-16-8 --skip-p1 --variants default:16:8
go bf16-p1 --storage-precision bfloat16
go bf16-p1-s1 --storage-precision bfloat16 --set training.seed=1
go bf16-res-16-8 --storage-precision bfloat16 --skip-p1 --variants resident:16:8
go bf16n-p1 --storage-precision bfloat16-nearest
wait
for f in /tmp/f32-*.log /tmp/bf16*.log; do echo "[$f]"; grep -v "Warning\|warn" $f | grep "MRR\|Error\|error\|Traceback" | tail -3; done
