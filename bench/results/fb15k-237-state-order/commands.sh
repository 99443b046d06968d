source .runs/prefix.sh
base="--dataset .data/fb15k-237 --config fb15k-237 --set training.epochs=60"
neg="training.num_negatives=3626"
python bench/partition_accuracy.py $base --variants order:16:4 --out $OUT/ord-p1-order.json > $OUT/a.log 2>&1 &
python bench/partition_accuracy.py $base --skip-p1 --variants default:16:4 --out $OUT/ord-16-4.json > $OUT/b.log 2>&1 &
python bench/partition_accuracy.py $base --set $neg --out $OUT/ord-p1-neg.json > $OUT/c.log 2>&1 &
python bench/partition_accuracy.py $base --skip-p1 --variants order:16:4+$neg --out $OUT/ord-order-neg.json > $OUT/d.log 2>&1 &
python bench/partition_accuracy.py $base --skip-p1 --variants order:32:8 --out $OUT/ord-order-32-8.json > $OUT/e.log 2>&1 &
wait
for f in a b c d e; do echo "[$f]"; grep -v "Warning\|warn" $OUT/$f.log | grep "MRR\|Error\|error" ; done > $OUT/rows.log
rm $OUT/?.log
cat $OUT/rows.log
