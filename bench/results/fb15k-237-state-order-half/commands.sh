source .runs/prefix.sh
base="--dataset .data/fb15k-237 --config fb15k-237 --set training.epochs=60"
python bench/partition_accuracy.py $base --variants order:16:8 --out $OUT/o8-p1-order.json > $OUT/a.log 2>&1 &
python bench/partition_accuracy.py $base --skip-p1 --variants default:16:8 --out $OUT/o8-default.json > $OUT/b.log 2>&1 &
python bench/partition_accuracy.py $base --skip-p1 --variants order:16:4 --out $OUT/o8-order-16-4.json > $OUT/c.log 2>&1 &
wait
for f in a b c; do echo "[$f]"; grep -v "Warning\|warn" $OUT/$f.log | grep "MRR\|Error\|error" ; done > $OUT/rows.log
rm $OUT/?.log
cat $OUT/rows.log
