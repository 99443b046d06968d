# Seventeenth session.
# CPU (the 2-core box, one process at a time), CoDEx-S's codex-s config at d=200:
python bench/partition_accuracy.py --dataset .data/codex-s --config codex-s --set training.device=cpu --set model.dim=200 --set training.epochs=60 --set evaluation.every=10 --variants default:16:4 default:16:8 --out cpu-d200-60ep.json
python bench/partition_accuracy.py --dataset .data/codex-s --config codex-s --set training.device=cpu --set model.dim=200 --set training.epochs=200 --set evaluation.every=20 --variants default:16:4 default:16:8 --out cpu-d200-200ep.json

# One H100, call 5 (the cs-* rows here; the s1-* rows are in bench/results/fb15k-237-relation-lr-higher/).
# .runs/prefix.sh installs the device's missing wheels into /tmp/site and sets PYTHONPATH.
source .runs/prefix.sh
c="--dataset .data/codex-s --config codex-s"
go() { name=$1; shift; timeout 340 python bench/partition_accuracy.py "$@" --out $OUT/$name.json > /tmp/$name.log 2>&1 & }
go cs-p1 $c
go cs-16-4 $c --skip-p1 --variants default:16:4
go cs-16-8 $c --skip-p1 --variants default:16:8
b="--dataset .data/fb15k-237 --config fb15k-237 --set training.epochs=60 --set training.seed=1"
go s1-p1 $b
go s1-16-4 $b --skip-p1 --variants default:16:4
go s1-rl03-p1 $b --set training.relation_lr=0.3
go s1-rl03-16-4 $b --set training.relation_lr=0.3 --skip-p1 --variants default:16:4
wait
for f in /tmp/cs-*.log /tmp/s1-*.log; do echo "[$f]"; grep -v "Warning\|warn" $f | grep "MRR\|Error\|error\|Traceback" | tail -3; done
