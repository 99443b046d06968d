source .runs/prefix.sh
base="--dataset .data/fb15k-237 --config fb15k-237 --set training.epochs=60"
python bench/partition_accuracy.py $base --out $OUT/rl-p1.json > $OUT/a.log 2>&1 &
python bench/partition_accuracy.py $base --set training.relation_lr=0.03 --out $OUT/rl-p1-003.json > $OUT/b.log 2>&1 &
python bench/partition_accuracy.py $base --skip-p1 --variants default:16:4+training.relation_lr=0.03 --out $OUT/rl-16-4-003.json > $OUT/c.log 2>&1 &
python bench/partition_accuracy.py $base --skip-p1 --variants order:16:4+training.relation_lr=0.03 --out $OUT/rl-order-003.json > $OUT/d.log 2>&1 &
python bench/partition_accuracy.py $base --skip-p1 --variants default:16:4+training.relation_lr=0.01 --out $OUT/rl-16-4-001.json > $OUT/e.log 2>&1 &
python bench/partition_accuracy.py $base --set training.relation_lr=0.01 --out $OUT/rl-p1-001.json > $OUT/f.log 2>&1 &
wait
for f in a b c d e f; do echo "[$f]"; grep -v "Warning\|warn" $OUT/$f.log | grep "MRR\|Error\|error" ; done > $OUT/rows.log
rm $OUT/?.log
cat $OUT/rows.log
