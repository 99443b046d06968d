"""The config's validation: every value checked in one place, an error naming the path to the first bad one
(``training.lr: expected > 0, got -1``) and the file and line that set it.

``validate`` only checks: the config keeps the values it was given. Plug-ins are looked up in their live
registries (after ``model.plugins`` is imported), and a decoder is asked what it can do.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
from typing import TYPE_CHECKING

from marius_py.config import (ADAGRAD_VARIANTS, AUTO_OR_BOOL, DEVICES, EVAL_PROTOCOLS, NEGATIVE_KINDS, PLACEMENTS,
                              PLUGIN_KEYS, PROCESS_MODELS, RELATION_OPTIMIZERS, STORAGE_DTYPES, device_list,
                              section_types)
from marius_py.errors import MariusInputError
from marius_py.layout import storage_layout
from marius_py.models import DECODERS
from marius_py.orderings import is_two_level
from marius_py.orderings.affine import AFFINE_BUFFERS, affine_defined
from marius_py.registry import import_plugins, where_defined

if TYPE_CHECKING:
    from marius_py.config import Config, StorageConfig


# Upper bounds of keys that reach the OS or the allocator, where a huge value would crash the run (or hang
# it) instead of failing cleanly; sizes whose harm depends on the graph are checked by the plan.
MOST_INT = 2**40                 # no count comes near (at 2^63 - 1, evaluation.batch_size evaluated nothing)
THREADS_PER_CORE = 4             # more threads only contend (100000 torch threads exhausted memory)
THREAD_KEYS = ("training.num_threads", "pipeline.load_threads", "storage.io_threads")
SEED_MAX = 2**32 - 1             # numpy's seed range; the generators' seeds multiply it into 64 bits
MOST_STORED_PARTITIONS = 4096    # an epoch's ordering grows with their square (4096: a minute to build)
MOST_WAIT_SECONDS = 365 * 86400  # longer waits overflow the clocks of threads and torch.distributed


def _check_value(ok: bool, path: str, problem: str, value, origins: dict) -> None:
    if not ok:
        source, line = origins.get(path, ("config", None))
        raise MariusInputError(f"{path}: {problem}, got {value!r}", path=source, line=line)


def validate(config: Config, origins: dict | None = None) -> Config:
    """Check every value; raise ``MariusInputError`` naming the first bad key.

    ``origins`` maps ``section.key`` to the (file, line) that set it.
    """
    origins = origins or {}
    _check = functools.partial(_check_value, origins=origins)
    _check_numbers(config, _check)
    _check_plugins(config, origins)
    m, t, e = config.model, config.training, config.evaluation
    choices = [("training.adagrad_variant", t.adagrad_variant, ADAGRAD_VARIANTS),
               ("training.relation_optimizer", t.relation_optimizer, RELATION_OPTIMIZERS),
               ("training.device", t.device, DEVICES), ("evaluation.protocol", e.protocol, EVAL_PROTOCOLS),
               ("evaluation.negative_sampling", e.negative_sampling, NEGATIVE_KINDS),
               ("pipeline.placement", config.pipeline.placement, PLACEMENTS),
               ("pipeline.processes", config.pipeline.processes, PROCESS_MODELS),
               ("pipeline.dedup", config.pipeline.dedup, AUTO_OR_BOOL),
               ("training.commits_behind", config.training.commits_behind, AUTO_OR_BOOL),
               ("training.score_dtype", t.score_dtype, ("float32", "bfloat16"))]
    _check_devices(t.devices, _check)
    _check(config.storage.dtype != "bfloat16" or len(device_list(t.devices)) <= 1, "storage.dtype",
           "expected float32 when training on several devices (bfloat16 tables train on one)",
           config.storage.dtype)
    for path, value, allowed in choices:
        _check(value in allowed, path, f"expected one of {', '.join(allowed)}", value)
    positive = [("model.dim", m.dim), ("model.init_scale", m.init_scale), ("training.epochs", t.epochs),
                ("training.batch_size", t.batch_size), ("training.num_chunks", t.num_chunks),
                ("training.lr", t.lr), ("training.relation_lr", t.relation_lr),
                ("evaluation.batch_size", e.batch_size), ("evaluation.num_negatives", e.num_negatives),
                ("model.margin", m.margin),
                ("pipeline.load_threads", config.pipeline.load_threads)]
    for path, value in positive:
        _check(value > 0, path, "expected > 0", value)
    _check(config.pipeline.step_grouping >= 0, "pipeline.step_grouping", "expected >= 0",
           config.pipeline.step_grouping)
    _check(config.pipeline.cache_rows >= -1, "pipeline.cache_rows", "expected >= -1", config.pipeline.cache_rows)
    nonnegative = [("storage.num_partitions", config.storage.num_partitions),
                   ("storage.memory_limit_gib", config.storage.memory_limit_gib), ("model.reg_weight", m.reg_weight),
                   ("training.num_threads", t.num_threads),
                   ("evaluation.every", e.every), ("training.seed", t.seed),
                   ("training.checkpoint_interval", t.checkpoint_interval),
                   ("evaluation.early_stopping_patience", e.early_stopping_patience),
                   ("pipeline.staleness_bound", config.pipeline.staleness_bound),
                   ("pipeline.queue_size", config.pipeline.queue_size)]
    for path, value in nonnegative:
        _check(value >= 0, path, "expected >= 0", value)
    _check_bounds(config, _check)
    _check(0 <= m.dropout < 1, "model.dropout", "expected in [0, 1)", m.dropout)
    _check(0 <= t.degree_fraction <= 1, "training.degree_fraction", "expected in [0, 1]",
           t.degree_fraction)
    _check(t.num_negatives == -1 or t.num_negatives > 0, "training.num_negatives",
           "expected > 0, or -1 for all nodes", t.num_negatives)
    _check(t.num_chunks <= t.batch_size, "training.num_chunks", "expected <= training.batch_size",
           t.num_chunks)
    _check(m.norm in (1, 2), "model.norm", "expected 1 or 2", m.norm)
    _check(t.relation_prediction >= 0, "training.relation_prediction", "expected >= 0", t.relation_prediction)
    _check_decoder_capabilities(config, _check)
    _check_storage(config.storage, _check)
    d = config.distributed
    _check(d.relation_sync_seconds > 0, "distributed.relation_sync_seconds", "expected > 0", d.relation_sync_seconds)
    _check(d.timeout_seconds > 0, "distributed.timeout_seconds", "expected > 0", d.timeout_seconds)
    _check(d.partitions_per_trainer == 0 or 2 <= d.partitions_per_trainer, "distributed.partitions_per_trainer",
           "expected 0 (automatic) or >= 2",
           d.partitions_per_trainer)
    return config


def _check_plugins(config: Config, origins: dict) -> None:
    """Import the modules of model.plugins, then find every plug-in the config names in its live registry (an
    unknown one is one error listing the registered names)."""
    source, line = origins.get("model.plugins", ("config", None))
    _check_value(isinstance(config.model.plugins, str), "model.plugins",
                 "expected comma-separated module names or .py paths", config.model.plugins, origins)
    import_plugins(config.model.plugins, "model.plugins", source, line)
    for path, registry in PLUGIN_KEYS.items():
        section, key = path.split(".")
        name = getattr(getattr(config, section), key)
        _check_value(name in registry, path, f"expected {registry.choices()}", name, origins)


def _check_decoder_capabilities(config: Config, _check) -> None:
    """What the decoder declares (``models.Decoder``'s class attributes) against what the config asks of it."""
    m = config.model
    decoder = DECODERS.get(m.decoder)
    step = decoder.dim_step()
    why = "complex-valued rows" if decoder.complex_valued else f"dim_multiple = {decoder.dim_multiple}"
    multiple = "even" if step == 2 else f"a multiple of {step}"
    _check(m.dim % step == 0, "model.dim", f"expected {multiple} for {m.decoder} ({why}: {where_defined(decoder)})",
           m.dim)
    _check(config.training.relation_prediction == 0 or decoder.supports_relation_prediction,
           "training.relation_prediction", f"needs a decoder linear in the relation vector (one declaring "
                                           f"supports_relation_prediction, such as distmult), not {m.decoder}",
           config.training.relation_prediction)


def _check_numbers(config: Config, _check) -> None:
    """Every int key holds an int within ``MOST_INT`` and every float key a finite number (inf and nan make
    sense for none: rates, weights, fractions, scales and seconds; a config set in code may hold anything)."""
    for section in dataclasses.fields(config):
        values = getattr(config, section.name)
        for name, kind in section_types(values).items():
            value, path = getattr(values, name), f"{section.name}.{name}"
            if kind == "int":
                _check(isinstance(value, numbers.Integral) and not isinstance(value, bool), path, "expected int",
                       value)
                _check(abs(value) <= MOST_INT, path, f"expected at most 2^40 ({MOST_INT})", value)
            elif kind == "float":
                _check(isinstance(value, numbers.Real) and not isinstance(value, bool), path, "expected float",
                       value)
                _check(math.isfinite(value), path, "expected a finite number", value)


def check_threads(config: Config, cores: int) -> None:
    """The thread keys within ``THREADS_PER_CORE`` threads for each core of the machine that trains (checked when
    a run is planned there, so a run trained on a larger machine still opens for eval on a smaller one)."""
    most = THREADS_PER_CORE * cores
    for path in THREAD_KEYS:
        section, key = path.split(".")
        value = getattr(getattr(config, section), key)
        _check_value(value <= most, path, f"expected at most {most} ({THREADS_PER_CORE} threads for each of this "
                                          f"machine's {cores} cores)", value, {})


def _check_bounds(config: Config, _check) -> None:
    """The upper bounds of keys that reach the OS (waits) or seed the generators (module constants)."""
    _check(config.training.seed <= SEED_MAX, "training.seed", f"expected at most {SEED_MAX} (numpy's seed range)",
           config.training.seed)
    timeout = config.distributed.timeout_seconds
    _check(timeout <= MOST_WAIT_SECONDS, "distributed.timeout_seconds",
           f"expected at most {MOST_WAIT_SECONDS} (a year)", timeout)




def _check_devices(devices: str, _check) -> None:
    names = device_list(devices)
    if not names:
        return
    well_formed = all(name == "cpu" or (name.startswith("cuda:") and name[5:].isdigit()) for name in names)
    _check(well_formed, "training.devices", "expected comma-separated cpu or cuda:N", devices)
    kinds = {name.split(":")[0] for name in names}
    _check(len(kinds) == 1, "training.devices", "expected devices of one kind (all cuda:N, or cpu to simulate)",
           devices)
    _check(len(names) >= 2, "training.devices", "expected at least two devices (one device: training.device)",
           devices)
    _check("cpu" in kinds or len(set(names)) == len(names), "training.devices", "expected each GPU once", devices)


def _check_storage(s: StorageConfig, _check) -> None:
    _check(s.dtype in STORAGE_DTYPES, "storage.dtype", f"expected one of {', '.join(STORAGE_DTYPES)}", s.dtype)
    _check(s.buffer_capacity >= 0, "storage.buffer_capacity", "expected >= 0", s.buffer_capacity)
    _check(s.lookahead >= 1, "storage.lookahead", "expected >= 1", s.lookahead)
    _check(s.io_threads >= 1, "storage.io_threads", "expected >= 1", s.io_threads)
    _check(s.edge_assignment in ("bucket", "balanced", "edge"), "storage.edge_assignment",
           "expected bucket, balanced or edge",
           s.edge_assignment)
    _check(s.direct_io in AUTO_OR_BOOL, "storage.direct_io", f"expected one of {', '.join(AUTO_OR_BOOL)}", s.direct_io)
    given_buffer = s.buffer_capacity or s.num_partitions
    _check(s.num_partitions > 1 or s.buffer_capacity == 0, "storage.buffer_capacity",
           "expected 0 (the plan's choice) unless storage.num_partitions > 1 is given", s.buffer_capacity)
    if s.num_partitions > 1:
        _check(2 <= given_buffer <= s.num_partitions, "storage.buffer_capacity",
               f"expected between 2 and storage.num_partitions ({s.num_partitions})", s.buffer_capacity)
    _check(s.partition_split >= 0, "storage.partition_split", "expected >= 0", s.partition_split)
    _check(s.group_size >= 0, "storage.group_size", "expected >= 0", s.group_size)
    _check(s.partition_split <= 1 or s.group_size == 0, "storage.partition_split",
           "expected 0 or 1 with an explicit storage.group_size (a split store picks its own)",
           s.partition_split)
    _check(s.partition_split <= 1 or is_two_level(s.ordering), "storage.partition_split",
           f"expected 0 or 1 with storage.ordering={s.ordering} (only comet and affine split partitions)",
           s.partition_split)
    stored = max(s.num_partitions, 1) * max(s.partition_split, 1)
    given, value = ("storage.partition_split", s.partition_split) if s.partition_split > 1 else \
        ("storage.num_partitions", s.num_partitions)
    _check(stored <= MOST_STORED_PARTITIONS, given, f"expected at most {MOST_STORED_PARTITIONS} partitions as stored "
           f"(storage.num_partitions x storage.partition_split: {stored})", value)
    layout = storage_layout(s)  # (torchrun's split of 1 passes and fails these checks as the automatic one does)
    if is_two_level(s.ordering) and layout.num_partitions > 1:
        k = layout.group_size
        _check(k >= 1 and layout.num_partitions % k == 0 and layout.buffer_capacity % k == 0
               and layout.buffer_capacity // k >= 2, "storage.group_size",
               "expected a divisor of num_partitions and buffer_capacity leaving >= 2 groups in the buffer", k)
    if s.ordering == "affine" and layout.buffer_capacity < layout.num_partitions:
        logical, slots = layout.num_partitions // layout.group_size, layout.buffer_capacity // layout.group_size
        _check(affine_defined(logical, slots), "storage.ordering",
               f"expected, for affine, P = C^2 / k partitions and a buffer of C with C / k in "
               f"{', '.join(map(str, AFFINE_BUFFERS))} (e.g. 16:4, 64:8, 64:16); this config has "
               f"{layout.num_partitions}:{layout.buffer_capacity} with group size k = {layout.group_size}",
               s.ordering)
        _check(s.edge_assignment == "bucket", "storage.edge_assignment",
               "expected bucket with affine (other assignments would also train buckets in the states between "
               "two lines, where a partition meets pairs off its lines)", s.edge_assignment)

