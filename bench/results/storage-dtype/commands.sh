# Eighteenth session, one H100 each; calls 2-4 ran the first version of storage.dtype=bfloat16 (before the review fixes).
# Call 2 (FB15k-237 rows, seed 0, and GPU tests):
source .runs/prefix.sh
b="--dataset .data/fb15k-237 --config fb15k-237 --set training.epochs=60"
go() { name=$1; shift; timeout 545 python bench/partition_accuracy.py $b "$@" --out $OUT/$name.json > /tmp/$name.log 2>&1 & }
go f32-p1
go f32-16-4 --skip-p1 --variants default:16:4
go bf16-p1 --set storage.dtype=bfloat16
go bf16-16-8 --set storage.dtype=bfloat16 --skip-p1 --variants default:16:8
go bf16-32-16 --set storage.dtype=bfloat16 --skip-p1 --variants default:32:16
go bf16-16-4 --set storage.dtype=bfloat16 --skip-p1 --variants default:16:4
timeout 540 python -m pytest -m gpu -q -p no:cacheprovider tests/test_storage_dtype.py tests/test_row_kernels_bfloat16.py tests/test_fused_step.py tests/test_out_of_core.py tests/test_training.py tests/test_pipeline.py > $OUT/gpu-tests.log 2>&1
tail -3 $OUT/gpu-tests.log
wait
for f in /tmp/f32-*.log /tmp/bf16*.log; do echo "[$f]"; grep -v "Warning\|warn" $f | grep "MRR\|Error\|error\|Traceback" | tail -3; done

# Call 3 (step and disk throughput with float32 / bfloat16 tables, first version; output stored as gpu-throughput-table-dtypes.json):
source .runs/prefix.sh
timeout 330 python bench/throughput.py --parts step disk --placements device host --score-dtypes bfloat16 \
    --table-dtypes float32 bfloat16 --seconds 2 --disk-edges 8000000 --json $OUT/throughput-table-dtypes.json 2>&1 \
    | grep -v "Warn\|warn" | tail -14
timeout 300 python -m pytest -m gpu -q -p no:cacheprovider tests/test_storage_dtype.py tests/test_row_kernels_bfloat16.py \
    tests/test_fused_step.py tests/test_out_of_core.py tests/test_training.py tests/test_pipeline.py \
    tests/test_multi_device.py tests/test_evaluation.py > $OUT/gpu-tests.log 2>&1
tail -3 $OUT/gpu-tests.log

# Call 4 (second seeds, and float32 32:8):
source .runs/prefix.sh
b="--dataset .data/fb15k-237 --config fb15k-237 --set training.epochs=60"
go() { name=$1; shift; timeout 400 python bench/partition_accuracy.py $b "$@" --out $OUT/$name.json > /tmp/$name.log 2>&1 & }
go s1-f32-p1 --set training.seed=1
go s1-bf16-16-8 --set training.seed=1 --set storage.dtype=bfloat16 --skip-p1 --variants default:16:8
go s1-bf16-32-16 --set training.seed=1 --set storage.dtype=bfloat16 --skip-p1 --variants default:32:16
go f32-32-8 --skip-p1 --variants default:32:8
go s1-f32-16-4 --set training.seed=1 --skip-p1 --variants default:16:4
wait
for f in /tmp/s1-*.log /tmp/f32-*.log; do echo "[$f]"; grep -v "Warning\|warn" $f | grep "MRR\|Error\|error\|Traceback" | tail -3; done

# On the 2-core box: CoDEx-M, bundled codex-m config, float32 then bfloat16 tables (the first version's run is
# stored as cpu-codex-m-first-version.json; cpu-codex-m.json is the final code's):
python bench/quality.py --runs codex-m:codex-m --datasets-root .data --set storage.dtype=float32,bfloat16 --out bench/results/storage-dtype/cpu-codex-m.json
# On the 2-core box, CoDEx-M out of core in the same memory (final code):
python bench/partition_accuracy.py --dataset .data/codex-m --config codex-m --variants default:16:4 default:16:8+storage.dtype=bfloat16 --out bench/results/storage-dtype/cpu-codex-m-partitions.json
