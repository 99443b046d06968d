# Seventeenth session. .runs/prefix.sh installs the device's missing wheels into /tmp/site and sets PYTHONPATH.
# call 3 (the RotatE run's JSON is in bench/results/fb15k-237-distance-norms/)
source .runs/prefix.sh
b="--dataset .data/fb15k-237 --config fb15k-237 --set training.epochs=60"
go() { name=$1; shift; timeout 575 python bench/partition_accuracy.py $b "$@" --out $OUT/$name.json > /tmp/$name.log 2>&1 & }
go h-rp0-p1 --set training.relation_prediction=0
go h-rp0-16-4 --set training.relation_prediction=0 --skip-p1 --variants default:16:4
go h-rl03-p1 --set training.relation_lr=0.3
go h-rl03-16-4 --set training.relation_lr=0.3 --skip-p1 --variants default:16:4
go h-16-4 --skip-p1 --variants default:16:4
go h-p1
q="--runs fb15k-237:fb15k-237 --datasets-root .data --set model.dim=400 --set training.relation_prediction=0 --set training.score_dtype=float32 --set training.epochs=30"
gq() { name=$1; shift; timeout 575 python bench/quality.py $q "$@" --out $OUT/$name.json > /tmp/$name.log 2>&1 & }
gq q-rotate-norm1-reg10-seed1 --set model.decoder=rotate --set model.rotate_norm=1 --set model.reg_weight=10 --set training.seed=1
wait
for f in /tmp/h-*.log /tmp/q-*.log; do echo "[$f]"; grep -v "Warning\|warn" $f | grep "MRR\|Error\|error\|Traceback" | tail -3; done

# call 4
source .runs/prefix.sh
b="--dataset .data/fb15k-237 --config fb15k-237 --set training.epochs=60"
go() { name=$1; shift; timeout 575 python bench/partition_accuracy.py $b "$@" --out $OUT/$name.json > /tmp/$name.log 2>&1 & }
go rl1-p1 --set training.relation_lr=1.0
go rl1-16-4 --set training.relation_lr=1.0 --skip-p1 --variants default:16:4
go rl1-32-8 --set training.relation_lr=1.0 --skip-p1 --variants default:32:8
go rl3-p1 --set training.relation_lr=3.0
go rl3-16-4 --set training.relation_lr=3.0 --skip-p1 --variants default:16:4
go rl3-32-8 --set training.relation_lr=3.0 --skip-p1 --variants default:32:8
go rl03-32-8 --set training.relation_lr=0.3 --skip-p1 --variants default:32:8
wait
for f in /tmp/rl*.log; do echo "[$f]"; grep -v "Warning\|warn" $f | grep "MRR\|Error\|error\|Traceback" | tail -3; done

# call 5: see bench/results/codex-s-resident-share/commands.sh (the s1-* rows: training.seed=1)
