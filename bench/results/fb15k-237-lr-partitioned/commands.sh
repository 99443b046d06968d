source .runs/prefix.sh
base="--dataset .data/fb15k-237 --config fb15k-237 --set training.epochs=60"
python bench/partition_accuracy.py $base --variants default:16:4 --out $OUT/pa-p1-and-16-4.json > $OUT/pa-a.log 2>&1 &
python bench/partition_accuracy.py $base --skip-p1 --variants default:16:4+training.lr=0.05 --out $OUT/pa-16-4-lr005.json > $OUT/pa-b.log 2>&1 &
python bench/partition_accuracy.py $base --skip-p1 --variants default:16:4+training.lr=0.07 --out $OUT/pa-16-4-lr007.json > $OUT/pa-c.log 2>&1 &
python bench/partition_accuracy.py $base --skip-p1 --variants default:32:8+training.lr=0.07 --out $OUT/pa-32-8-lr007.json > $OUT/pa-d.log 2>&1 &
python bench/partition_accuracy.py $base --set training.lr=0.07 --out $OUT/pa-p1-lr007.json > $OUT/pa-e.log 2>&1 &
wait
for f in $OUT/pa-*.log; do echo "== $f"; grep -v "Warning\|warn" $f | tail -6; done
