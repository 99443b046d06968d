source .runs/prefix.sh
b="--dataset .data/fb15k-237 --config fb15k-237"
python bench/partition_accuracy.py $b --set training.epochs=100 --out $OUT/e100-p1.json > $OUT/a.log 2>&1 &
python bench/partition_accuracy.py $b --set training.epochs=100 --skip-p1 --variants default:16:4 --out $OUT/e100-16-4.json > $OUT/b.log 2>&1 &
python bench/partition_accuracy.py $b --set training.epochs=100 --skip-p1 --variants default:32:8 --out $OUT/e100-32-8.json > $OUT/c.log 2>&1 &
python bench/partition_accuracy.py $b --set training.epochs=150 --out $OUT/e150-p1.json > $OUT/d.log 2>&1 &
python bench/partition_accuracy.py $b --set training.epochs=150 --skip-p1 --variants default:16:4 --out $OUT/e150-16-4.json > $OUT/e.log 2>&1 &
wait
for f in a b c d e; do echo "[$f]"; grep -v "Warning\|warn" $OUT/$f.log | grep "MRR\|Error\|error\|Traceback" ; done > $OUT/rows.log
rm $OUT/?.log
cat $OUT/rows.log
