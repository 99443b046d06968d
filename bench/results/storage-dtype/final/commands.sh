# Call 5 (final code: hashed rounding noise, one stream for bfloat16 tables in GPU memory):
source .runs/prefix.sh
timeout 150 python -m pytest -m gpu -q -p no:cacheprovider tests/test_row_kernels_bfloat16.py tests/test_storage_dtype.py > $OUT/gpu-tests-kernels.log 2>&1
tail -2 $OUT/gpu-tests-kernels.log
grep -q " passed" $OUT/gpu-tests-kernels.log && ! grep -q "failed\|error" $OUT/gpu-tests-kernels.log || exit 1
timeout 100 python bench/throughput.py --parts step --placements device --score-dtypes bfloat16 \
    --table-dtypes float32 bfloat16 --seconds 2 --json $OUT/throughput-device.json 2>&1 | grep "^step"
b="--dataset .data/fb15k-237 --config fb15k-237 --set training.epochs=60"
go() { name=$1; shift; timeout 280 python bench/partition_accuracy.py $b "$@" --out $OUT/$name.json > /tmp/$name.log 2>&1 & }
go f32-p1
go bf16-p1 --set storage.dtype=bfloat16
go bf16-16-8 --set storage.dtype=bfloat16 --skip-p1 --variants default:16:8
go s1-bf16-16-8 --set storage.dtype=bfloat16 --set training.seed=1 --skip-p1 --variants default:16:8
timeout 270 python -m pytest -m gpu -q -p no:cacheprovider tests/test_fused_step.py tests/test_out_of_core.py \
    tests/test_training.py tests/test_pipeline.py tests/test_evaluation.py tests/test_multi_device.py > $OUT/gpu-tests.log 2>&1
tail -2 $OUT/gpu-tests.log
wait
for f in /tmp/f32-*.log /tmp/bf16*.log /tmp/s1-*.log; do echo "[$f]"; grep -v "Warning\|warn" $f | grep "MRR\|Error\|error\|Traceback" | tail -3; done

# Call 6 (final code):
source .runs/prefix.sh
timeout 420 python bench/throughput.py --parts step disk --placements host --score-dtypes bfloat16 \
    --table-dtypes float32 bfloat16 --seconds 2 --disk-edges 8000000 --json $OUT/throughput-host-disk.json 2>&1 \
    | grep "^step\|^disk"
