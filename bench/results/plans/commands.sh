# bench/plans.py's runs, session of 2026-11-29.
# On the 2-core, 24 GiB box (cpu-*.json):
python bench/plans.py --datasets-root ../shared/datasets --workdir /tmp/plans --graphs codex-s codex-m fb15k-237 \
    --epochs 3 --out bench/results/plans/cpu-small.json
# (cpu-freebase-0.2-float32-rows.json: the float32 4:2 row alone, --skip-plan, before the faster rounding of 0e13109;
#  cpu-freebase-0.2.json: at 0e13109, the plan and both manual settings)
python bench/plans.py --workdir /tmp/plans --graphs freebase:0.2 --epochs 1 \
    --manual "storage.num_partitions=16 storage.buffer_capacity=8 storage.dtype=float32 storage.ordering=beta" \
             "storage.num_partitions=4 storage.buffer_capacity=2 storage.dtype=float32" \
    --out bench/results/plans/cpu-freebase-0.2.json
# On one H200 (call 12 at 449715a, .runs/call12.sh with bench/results/plan/commands.sh's prefix; gpu-*.json):
python bench/freebase_shape.py --out /tmp/plans/freebase-1.0 --partitions 16 --scale 1.0
python bench/plans.py --datasets-root .data --workdir /tmp/plans --graphs codex-s codex-m fb15k-237 --epochs 2 \
    --set training.device=cuda --out bench/results/plans/gpu-small.json
python bench/plans.py --workdir /tmp/plans --graphs freebase:1.0 --epochs 2 --set training.device=cuda \
    training.batch_size=50000 training.num_chunks=10 training.num_negatives=1000 training.degree_fraction=0.5 \
    training.adagrad_variant=rowwise training.checkpoint_interval=86400 \
    --manual "pipeline.placement=host" "storage.num_partitions=16 storage.buffer_capacity=8 storage.dtype=float32 storage.ordering=beta" \
    --out bench/results/plans/gpu-freebase.json
