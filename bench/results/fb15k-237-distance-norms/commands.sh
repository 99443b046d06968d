# .runs/prefix.sh installs the device's missing wheels into /tmp/site and sets PYTHONPATH.
# call 1 (three seeds at N3 0.1):
source .runs/prefix.sh
common="--runs fb15k-237:fb15k-237 --datasets-root .data --set model.decoder=transe --set model.dim=400 --set training.relation_prediction=0 --set training.score_dtype=float32 --set model.reg_weight=0.1 --set training.epochs=30"
for norm in 1 2; do for seed in 0 1 2; do
  timeout 570 python bench/quality.py $common --set model.transe_norm=$norm --set training.seed=$seed \
     --out $OUT/q-transe-norm$norm-seed$seed.json > /tmp/q-transe-norm$norm-seed$seed.log 2>&1 &
done; done
wait
for f in /tmp/q-transe-*.log; do echo "[$f]"; grep -v "Warning\|warn" $f | tail -n 4; done > $OUT/rows.log
cat $OUT/rows.log

# call 2
source .runs/prefix.sh
common="--runs fb15k-237:fb15k-237 --datasets-root .data --set model.decoder=transe --set model.dim=400 --set training.relation_prediction=0 --set training.score_dtype=float32 --set training.epochs=30"
for norm in 1 2; do for reg in 0 0.01 0.03; do
  timeout 570 python bench/quality.py $common --set model.transe_norm=$norm --set model.reg_weight=$reg \
     --out $OUT/q-transe-norm$norm-reg$reg.json > /tmp/q-transe-norm$norm-reg$reg.log 2>&1 &
done; done
wait
for f in /tmp/q-transe-*.log; do echo "[$f]"; grep -v "Warning\|warn" $f | tail -n 4; done > $OUT/rows.log
cat $OUT/rows.log

# call 3
source .runs/prefix.sh
base="--runs fb15k-237:fb15k-237 --datasets-root .data --set model.dim=400 --set training.relation_prediction=0 --set training.score_dtype=float32 --set training.epochs=30"
go() { name=$1; shift; timeout 570 python bench/quality.py $base "$@" --out $OUT/$name.json > /tmp/$name.log 2>&1 & }
go q-transe-norm1-reg0.3 --set model.decoder=transe --set model.transe_norm=1 --set model.reg_weight=0.3
go q-transe-norm1-reg1 --set model.decoder=transe --set model.transe_norm=1 --set model.reg_weight=1.0
go q-transe-norm2-reg0-seed1 --set model.decoder=transe --set model.transe_norm=2 --set model.reg_weight=0 --set training.seed=1
go q-rotate-norm1-reg0 --set model.decoder=rotate --set model.rotate_norm=1 --set model.reg_weight=0
go q-rotate-norm1-reg0.01 --set model.decoder=rotate --set model.rotate_norm=1 --set model.reg_weight=0.01
go q-rotate-norm2-reg0 --set model.decoder=rotate --set model.rotate_norm=2 --set model.reg_weight=0
go q-rotate-norm2-reg0.01 --set model.decoder=rotate --set model.rotate_norm=2 --set model.reg_weight=0.01
wait
for f in /tmp/q-*.log; do echo "[$f]"; grep -v "Warning\|warn" $f | tail -n 3; done

# call 4
source .runs/prefix.sh
base="--runs fb15k-237:fb15k-237 --datasets-root .data --set model.dim=400 --set training.relation_prediction=0 --set training.score_dtype=float32 --set training.epochs=30"
go() { name=$1; shift; timeout 570 python bench/quality.py $base "$@" --out $OUT/$name.json > /tmp/$name.log 2>&1 & }
go q-transe-norm1-reg3 --set model.decoder=transe --set model.transe_norm=1 --set model.reg_weight=3
go q-transe-norm1-reg10 --set model.decoder=transe --set model.transe_norm=1 --set model.reg_weight=10
go q-transe-norm2-reg0-seed2 --set model.decoder=transe --set model.transe_norm=2 --set model.reg_weight=0 --set training.seed=2
go q-rotate-norm1-reg0.3 --set model.decoder=rotate --set model.rotate_norm=1 --set model.reg_weight=0.3
go q-rotate-norm1-reg1 --set model.decoder=rotate --set model.rotate_norm=1 --set model.reg_weight=1.0
go q-rotate-norm2-reg0.01-seed1 --set model.decoder=rotate --set model.rotate_norm=2 --set model.reg_weight=0.01 --set training.seed=1
wait
for f in /tmp/q-*.log; do echo "[$f]"; grep -v "Warning\|warn" $f | tail -n 2 | head -1; done

# call 5
source .runs/prefix.sh
base="--runs fb15k-237:fb15k-237 --datasets-root .data --set model.dim=400 --set training.relation_prediction=0 --set training.score_dtype=float32 --set training.epochs=30"
go() { name=$1; shift; timeout 560 python bench/quality.py $base "$@" --out $OUT/$name.json > /tmp/$name.log 2>&1 & }
go q-transe-norm1-reg30 --set model.decoder=transe --set model.transe_norm=1 --set model.reg_weight=30
go q-transe-norm1-reg100 --set model.decoder=transe --set model.transe_norm=1 --set model.reg_weight=100
go q-rotate-norm1-reg3 --set model.decoder=rotate --set model.rotate_norm=1 --set model.reg_weight=3
go q-rotate-norm1-reg10 --set model.decoder=rotate --set model.rotate_norm=1 --set model.reg_weight=10
wait
for f in /tmp/q-*.log; do echo "[$f]"; grep -v "Warning\|warn" $f | tail -n 2 | head -1; done

# seventeenth session (the two RotatE runs of bench/results/fb15k-237-resident-emulation/commands.sh, call 2):
source .runs/prefix.sh
q="--runs fb15k-237:fb15k-237 --datasets-root .data --set model.dim=400 --set training.relation_prediction=0 --set training.score_dtype=float32 --set training.epochs=30"
gq() { name=$1; shift; timeout 575 python bench/quality.py $q "$@" --out $OUT/$name.json > /tmp/$name.log 2>&1 & }
gq q-rotate-norm1-reg30 --set model.decoder=rotate --set model.rotate_norm=1 --set model.reg_weight=30
gq q-rotate-norm1-reg100 --set model.decoder=rotate --set model.rotate_norm=1 --set model.reg_weight=100
wait
