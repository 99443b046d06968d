source .runs/prefix.sh
base="--dataset .data/fb15k-237 --config fb15k-237 --set training.epochs=60"
rw="training.adagrad_variant=rowwise"
python bench/partition_accuracy.py $base --variants default:16:4 --out $OUT/rw-p1-full-16-4-full.json > $OUT/a.log 2>&1 &
python bench/partition_accuracy.py $base --set $rw --out $OUT/rw-p1-rowwise.json > $OUT/b.log 2>&1 &
python bench/partition_accuracy.py $base --skip-p1 --variants default:16:8+$rw --out $OUT/rw-16-8-rowwise.json > $OUT/c.log 2>&1 &
python bench/partition_accuracy.py $base --skip-p1 --variants default:16:4+$rw --out $OUT/rw-16-4-rowwise.json > $OUT/d.log 2>&1 &
python bench/partition_accuracy.py $base --skip-p1 --variants default:16:8 --out $OUT/rw-16-8-full.json > $OUT/e.log 2>&1 &
wait
for f in a b c d e; do grep -v "Warning\|warn" $OUT/$f.log | grep "MRR\|Error\|error" ; done > $OUT/rows.log
rm $OUT/?.log
cat $OUT/rows.log
