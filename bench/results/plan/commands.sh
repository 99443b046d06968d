# Issue 40, session of 2026-11-29, one H200 (nvidia-h200). Scripts as run (carry .runs .data .whl; .whl: zarr 3.1.6,
# numcodecs, donfig, google-crc32c, and for call 10 optuna 5.0.0 with its needs, as the device README shows).

# .runs/prefix.sh
# Device calls: zarr and its needs from carried wheels (.whl), marius_py.storage/.pipeline/.orderings importable
# from this checkout, unbuffered output.
set -o pipefail
export PYTHONUNBUFFERED=1
export MARIUS_PY_CACHE=/tmp/marius-cache
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /tmp/pip-whl.log 2>&1 || tail -3 /tmp/pip-whl.log
for d in storage pipeline orderings; do ln -sfn ../$d marius_py/$d; done
export PYTHONPATH=$PWD:/tmp/site
python -c "import marius_py.storage, zarr, torch; print('marius_py ok, zarr', zarr.__version__, 'torch', torch.__version__, torch.cuda.device_count(), 'GPU(s)')"

# Call 4 (21dffba): float32 BETA 16:8 against the plan choosing the largest buffer in the same memory
B="python bench/larger_than_memory.py --workdir /tmp/fb86 --graph freebase --partitions 16 --decoder complex --dim 100 --batch-size 50000 --negatives 1000 --degree-fraction 0.5 --adagrad rowwise --device cuda --passes full"
timeout 300 $B --buffer 8 --ordering beta --dd-gib 4 --set storage.dtype=float32 --out $OUT/f32-beta-16-8.json
rm -rf /tmp/fb86/run; timeout 270 $B --buffer 0 --ordering comet --set storage.memory_limit_gib=20.239 --out $OUT/plan-16-memory-f32c8.json

# Call 5 (21dffba): .runs/accuracy.sh
# Issue 40 item 5: out-of-core accuracy rows with the final defaults (the plan's store in the memory of a float32
# default P:C buffer: bench/partition_accuracy.py memory:P:C), FB15k-237 (60 epochs) and CoDEx-M, beside
# in-memory runs; GPU tests of the plan's changes alongside.
source .runs/prefix.sh
(timeout 420 python -m pytest -m gpu -q -p no:cacheprovider tests/test_out_of_core.py tests/test_storage_dtype.py tests/test_training.py tests/test_pipeline.py tests/test_fused_step.py tests/test_buffer.py > $OUT/gpu-tests.log 2>&1; tail -2 $OUT/gpu-tests.log) &
b="--dataset .data/fb15k-237 --config fb15k-237 --set training.epochs=60"
go() { name=$1; shift; timeout 520 python bench/partition_accuracy.py $b "$@" --out /tmp/acc/$name.json > /tmp/acc/$name.log 2>&1 & }
mkdir -p /tmp/acc
go fb-p1
go fb-memory-8-2 --skip-p1 --variants memory:8:2
go fb-memory-16-4 --skip-p1 --variants memory:16:4
go fb-memory-32-8 --skip-p1 --variants memory:32:8
b="--dataset .data/codex-m --config codex-m"
go cm --variants memory:8:2 memory:16:4 memory:32:8
wait
for f in /tmp/acc/*.log; do echo "[$f]"; grep -v "Warning\|warn" $f | grep "MRR\|Error\|error\|Traceback" | tail -4; done
cd /tmp/acc && tar czf $OUT/accuracy.tgz *.json *.log

# Call 6 (85b27d4, the plan puts accuracy first): .runs/final.sh
# Issue 40: the Freebase86m-shaped disk epoch (float32 BETA 16:8 against the plan's store in its memory) and the
# out-of-core accuracy rows, at the plan that puts accuracy first; run one after the other on one H200.
source .runs/prefix.sh
W=/tmp/fb86; mkdir -p /tmp/acc
python bench/freebase_shape.py --out $W/dataset --partitions 16 --scale 1.0 2>&1 | tail -1
S="model.decoder=complex model.dim=100 training.batch_size=50000 training.num_chunks=10 training.num_negatives=1000 training.degree_fraction=0.5 training.adagrad_variant=rowwise training.device=cuda storage.ordering=comet storage.memory_limit_gib=20.239"
python -m marius_py plan dataset.path=$W/dataset $S --partitions 16 | tee $OUT/plan.txt
PHYS=$(python -m marius_py plan dataset.path=$W/dataset $S --partitions 16 --json | python -c "import json,sys; print(json.load(sys.stdin)['physical_partitions'])")
(python -c "from marius_py.bundled import bucketed_for_run; from marius_py.dataset import Dataset; bucketed_for_run($PHYS, Dataset('$W/dataset'), False)"; echo rebucketed $PHYS) &
# (the accuracy runs of call 5 here, as .runs/accuracy.sh has them, with timeout 300, while the re-bucketing ran)
(cd /tmp/acc && tar czf $OUT/accuracy.tgz *.json *.log)
B="python bench/larger_than_memory.py --workdir $W --graph freebase --partitions 16 --decoder complex --dim 100 --batch-size 50000 --negatives 1000 --degree-fraction 0.5 --adagrad rowwise --device cuda --passes full"
timeout 200 $B --buffer 8 --ordering beta --set storage.dtype=float32 --out $OUT/f32-beta-16-8.json 2>&1 | grep -v "state \|Warn" | tail -6
rm -rf $W/run
timeout 170 $B --buffer 0 --ordering comet --set storage.memory_limit_gib=20.239 --out $OUT/plan-16-memory-f32c8.json 2>&1 | grep -v "state \|Warn" | tail -6

# Call 10 (387df78): .runs/tune-smoke.sh (issue 42's GPU path; three trials completed)
# Issue 42's GPU path: a three-trial search on CoDEx-M with one worker on the GPU (the tune extra from .whl).
source .runs/prefix.sh
printf 'training.lr: {low: 0.02, high: 0.3, log: true}\n' > /tmp/space.yaml
timeout 240 python -m marius_py tune codex-m training.epochs=3 evaluation.every=1 --space /tmp/space.yaml --trials 3 --gpus 1 --run-dir /tmp/tune-smoke 2>&1 | grep -v Warn | tail -14
ls /tmp/tune-smoke; cp /tmp/tune-smoke/best.yaml $OUT/ 2>/dev/null

# Call 7 (2f20b74, the buffer stays filled between epochs): .runs/fb-carry.sh
# Issue 40 item 4 at HEAD (the buffer stays filled between epochs): float32 BETA 16:8 against the plan's store in its
# memory, one after the other, each timing its second epoch (the first untimed).
source .runs/prefix.sh
W=/tmp/fb86
python bench/freebase_shape.py --out $W/dataset --partitions 16 --scale 1.0 2>&1 | tail -1
S="model.decoder=complex model.dim=100 training.batch_size=50000 training.num_chunks=10 training.num_negatives=1000 training.degree_fraction=0.5 training.adagrad_variant=rowwise training.device=cuda storage.ordering=comet storage.memory_limit_gib=20.239"
python -m marius_py plan dataset.path=$W/dataset $S --partitions 16 | tee $OUT/plan.txt
PHYS=$(python -m marius_py plan dataset.path=$W/dataset $S --partitions 16 --json | python -c "import json,sys; print(json.load(sys.stdin)['physical_partitions'])")
time python -c "from marius_py.bundled import bucketed_for_run; from marius_py.dataset import Dataset; bucketed_for_run($PHYS, Dataset('$W/dataset'), False)"; echo rebucketed $PHYS
B="python bench/larger_than_memory.py --workdir $W --graph freebase --partitions 16 --decoder complex --dim 100 --batch-size 50000 --negatives 1000 --degree-fraction 0.5 --adagrad rowwise --device cuda --passes full"
timeout 230 $B --buffer 8 --ordering beta --set storage.dtype=float32 --out $OUT/f32-beta-16-8.json 2>&1 | grep -v "state \|Warn" | tail -8
rm -rf $W/run
timeout 200 $B --buffer 0 --ordering comet --set storage.memory_limit_gib=20.239 --out $OUT/plan-16-memory-f32c8.json 2>&1 | grep -v "state \|Warn" | tail -8

# Call 11 (449715a, the final code of issue 40): .runs/call11.sh
# The out-of-core accuracy rows at the final defaults (the fb15k-237 config's searched values, the buffer kept
# between epochs, chunked evaluation) beside the Freebase86m-shaped dataset's generation, GPU tests of evaluation
# and the buffer alongside (13 passed); then float32 BETA 16:8 (full) and the plan's store in its memory with
# --passes io,compute,full: the full pass was cut by this script's own 240 s limit for the three passes (io and
# compute finished; the compute pass is the step alone). The rows' io_predicted were recomputed on a CPU after
# the bench learned the buffer kept between epochs (the call printed IO MISMATCH: the old prediction flushed
# every epoch; io_predicted_at_run keeps it).
source .runs/prefix.sh
W=/tmp/fb86; mkdir -p /tmp/acc
# (the five accuracy runs of call 5 in the background, with timeout 300, and pytest -m gpu of
#  tests/test_evaluation.py tests/test_buffer.py tests/test_out_of_core.py)
python bench/freebase_shape.py --out $W/dataset --partitions 16 --scale 1.0
# (the plan and the re-bucketing to 64 as in call 7)
B="python bench/larger_than_memory.py --workdir $W --graph freebase --partitions 16 --decoder complex --dim 100 --batch-size 50000 --negatives 1000 --degree-fraction 0.5 --adagrad rowwise --device cuda"
timeout 170 $B --passes full --buffer 8 --ordering beta --set storage.dtype=float32 --out $OUT/f32-beta-16-8.json
rm -rf $W/run
timeout 240 $B --passes io,compute,full --buffer 0 --ordering comet --set storage.memory_limit_gib=20.239 --out $OUT/plan-16-memory-f32c8.json

# Call 14 (c17be03), issue 40's last call at the final code: .runs/call14.sh as run, one H200 (nvidia-h200); the train
# run through the wrapper .runs/train_epochs.py below (since 478ba57: bench/larger_than_memory.py --passes train).
source .runs/prefix.sh
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
W=/tmp/fb86; mkdir -p $W
(timeout 200 python -m pytest -m gpu -q -p no:cacheprovider tests/test_row_kernels_bfloat16.py tests/test_out_of_core.py tests/test_storage_dtype.py > $OUT/gpu-tests.log 2>&1; tail -3 $OUT/gpu-tests.log) &
TESTS=$!
# The plan's 64 physical partitions written directly (same seed, same graph) beside the 16 of BETA: no re-bucketing.
python bench/freebase_shape.py --out $W/dataset --partitions 16 --scale 1.0 2>&1 | tail -1 &
G1=$!
mkdir -p /tmp/fb64; python bench/freebase_shape.py --out /tmp/fb64/dataset --partitions 64 --scale 1.0 2>&1 | tail -1 &
G2=$!
wait $G1 $G2; el generated
S="model.decoder=complex model.dim=100 training.batch_size=50000 training.num_chunks=10 training.num_negatives=1000 training.degree_fraction=0.5 training.adagrad_variant=rowwise training.device=cuda storage.ordering=comet storage.memory_limit_gib=20.239"
python -m marius_py plan dataset.path=$W/dataset $S --partitions 16 | tee $OUT/plan.txt
PHYS=$(python -m marius_py plan dataset.path=$W/dataset $S --partitions 16 --json | python -c "import json,sys; print(json.load(sys.stdin)['physical_partitions'])")
if [ "$PHYS" = 64 ]; then W2=/tmp/fb64; else W2=$W; el "plan wants $PHYS physical partitions: the runs re-bucket"; fi
wait $TESTS; el tests done
B="python bench/larger_than_memory.py --graph freebase --partitions 16 --decoder complex --dim 100 --batch-size 50000 --negatives 1000 --degree-fraction 0.5 --adagrad rowwise --device cuda"
timeout 190 $B --workdir $W --passes full --buffer 8 --ordering beta --set storage.dtype=float32 --out $OUT/f32-beta-16-8.json 2>&1 | grep -v "state \|Warn" | tail -5
rm -rf $W/run; el baseline done
timeout 130 $B --workdir $W2 --passes compute --buffer 0 --ordering comet --set storage.memory_limit_gib=20.239 --out $OUT/plan-compute.json 2>&1 | grep -v "state \|Warn" | tail -4
rm -rf $W2/run; el step alone done
timeout $(( 585 - ($(date +%s) - T0) )) python .runs/train_epochs.py /tmp/trainrun 3 dataset.path=$W2/dataset $S --partitions 16 training.epochs=3 evaluation.every=0 evaluation.protocol=sampled evaluation.negative_sampling=mixed evaluation.num_negatives=2000 training.checkpoint_interval=1000
cp /tmp/trainrun/metrics.jsonl $OUT/train-metrics.jsonl; el end

# .runs/train_epochs.py (call 14's wrapper):
#   """`marius-py train` end to end for N epochs, stopped once epoch N's line is printed (the final validation and
#   test of 16.9M edges are not the epoch): prints every line, then each epoch record's seconds, edges/s and IO
#   from metrics.jsonl, and the command's peak RSS.  Usage: train_epochs.py RUN_DIR N [train args...]"""
#   import json, resource, subprocess, sys, time
#   from pathlib import Path
#   
#   run_dir, epochs, rest = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
#   started = time.perf_counter()
#   proc = subprocess.Popen([sys.executable, "-m", "marius_py", "train", *rest, "--run-dir", str(run_dir)],
#                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
#   for line in proc.stdout:
#       if "Warn" not in line:
#           print(line, end="", flush=True)
#       if line.startswith(f"epoch {epochs}:"):
#           time.sleep(5)  # (epoch N-1's record is logged before epoch N starts; this waits for nothing else)
#           proc.kill()  # (no commit of 17 GB on the way out: the run is thrown away)
#           break
#   proc.wait()
#   print(f"command ran {time.perf_counter() - started:.1f} s; peak RSS of the command "
#         f"{resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20:.2f} GiB")
#   records = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines() if l.strip()]
#   for r in records:
#       if r.get("event") == "epoch":
#           print(json.dumps({k: r.get(k) for k in ("epoch", "seconds", "edges_per_s", "io", "time")}))
#       elif r.get("event") in ("startup", "plan"):
#           print(json.dumps(r)[:1500])

# Call 18 (478ba57): the repo's train pass, the plan's settings (.runs/call18.sh)
source .runs/prefix.sh
mkdir -p /tmp/fb64; python bench/freebase_shape.py --out /tmp/fb64/dataset --partitions 64 --scale 1.0 2>&1 | tail -1
timeout 250 python bench/larger_than_memory.py --workdir /tmp/fb64 --graph freebase --partitions 16 --decoder complex --dim 100 --batch-size 50000 --negatives 1000 --degree-fraction 0.5 --adagrad rowwise --device cuda --buffer 0 --ordering comet --passes compute,train --set storage.memory_limit_gib=20.239 --out $OUT/plan-compute-train.json 2>&1 | grep -v "state \|Warn" | tail -9
