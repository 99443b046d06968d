source .runs/prefix.sh
base="--dataset .data/fb15k-237 --config fb15k-237 --set training.epochs=60"
edge="storage.edge_assignment=edge"
python bench/partition_accuracy.py $base --out $OUT/ea-p1.json > $OUT/a.log 2>&1 &
python bench/partition_accuracy.py $base --skip-p1 --variants default:16:4+$edge --out $OUT/ea-default-edge.json > $OUT/b.log 2>&1 &
python bench/partition_accuracy.py $base --skip-p1 --variants comet:16:4:4+$edge --out $OUT/ea-k4-edge.json > $OUT/c.log 2>&1 &
python bench/partition_accuracy.py $base --skip-p1 --variants comet:32:8:2+$edge --out $OUT/ea-k2-edge.json > $OUT/d.log 2>&1 &
python bench/partition_accuracy.py $base --skip-p1 --variants comet:16:4:4 --out $OUT/ea-k4.json > $OUT/e.log 2>&1 &
python bench/partition_accuracy.py $base --skip-p1 --variants comet:32:8:2 --out $OUT/ea-k2.json > $OUT/f.log 2>&1 &
wait
for f in a b c d e f; do echo "[$f]"; grep -v "Warning\|warn" $OUT/$f.log | grep "MRR\|Error\|error" ; done > $OUT/rows.log
rm $OUT/?.log
cat $OUT/rows.log
