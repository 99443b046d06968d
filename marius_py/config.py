"""The one typed config schema: dataclasses with a help string on every field.

A config is YAML with the sections below; ``key.sub=value`` overrides from the
command line are coerced through the schema, and every value is checked in
``validate`` with an error naming the path (``training.lr: must be > 0, got -1``).
The resolved config is saved next to every run's checkpoints.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
import numbers
import re
import typing
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from marius_py import orderings
from marius_py.models import DECODERS, LOSSES, REGULARIZERS
from marius_py.negatives import NEGATIVE_SAMPLERS
from marius_py.orderings import Ordering, OrderingSpec, build_ordering, default_group_size, default_split, is_two_level
from marius_py.orderings.affine import AFFINE_BUFFERS, affine_defined, affine_group_size, affine_split
from marius_py.errors import MariusInputError
from marius_py.registry import Registry, import_plugins, where_defined
from marius_py.storage.partitioning import partitions_filled


def _check_ordering(name: str, spec) -> None:
    if not (isinstance(spec, OrderingSpec) and spec.name == name):
        raise MariusInputError(f"ordering {name!r} ({where_defined(spec)}) is not an OrderingSpec named {name!r}",
                               expected="mp.ORDERINGS.register(name, OrderingSpec(name, builder, ...))")


# The orderings' own table (the orderings package imports numpy alone), as a registry.
ORDERINGS: Registry[OrderingSpec] = Registry("ordering", "mp.ORDERINGS", check=_check_ordering,
                                             entries=orderings.ORDERINGS, loaded_by="model.plugins")
# Keys whose value names a plug-in, and the registry it is found in.
PLUGIN_KEYS = {"model.decoder": DECODERS, "model.loss": LOSSES, "model.regularizer": REGULARIZERS,
               "training.negative_sampler": NEGATIVE_SAMPLERS, "storage.ordering": ORDERINGS}
# str keys of comma-separated items, which a YAML list may give
LIST_KEYS = ("model.plugins", "training.devices", "training.callbacks")
ADAGRAD_VARIANTS = ("full", "rowwise")
RELATION_OPTIMIZERS = ("adagrad", "adam")
DEVICES = ("auto", "cpu", "cuda")
EVAL_PROTOCOLS = ("filtered", "sampled")
NEGATIVE_KINDS = ("uniform", "degree", "mixed")
PLACEMENTS = ("auto", "device", "host", "replicated", "split")
PROCESS_MODELS = ("one", "per_device")
AUTO_OR_BOOL = ("auto", "true", "false")  # keys that take auto, true or false
STORAGE_DTYPES = ("auto", "float32", "bfloat16")

# Upper bounds of keys that reach the OS or the allocator, where a huge value would crash the run (or hang
# it) instead of failing cleanly; sizes whose harm depends on the graph are checked by the plan.
MOST_INT = 2**40                 # no count comes near (at 2^63 - 1, evaluation.batch_size evaluated nothing)
THREADS_PER_CORE = 4             # more threads only contend (100000 torch threads exhausted memory)
THREAD_KEYS = ("training.num_threads", "pipeline.load_threads", "storage.io_threads")
SEED_MAX = 2**32 - 1             # numpy's seed range; the generators' seeds multiply it into 64 bits
MOST_STORED_PARTITIONS = 4096    # an epoch's ordering grows with their square (4096: a minute to build)
MOST_WAIT_SECONDS = 365 * 86400  # longer waits overflow the clocks of threads and torch.distributed


def _f(default, help: str, **kw):
    """A schema field with its help text (shown by ``marius-py train --help-config``)."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help}, **kw)
    return field(default=default, metadata={"help": help}, **kw)


def _plugin_help(kind: str, registry: str) -> str:
    return f"a {kind} registered in {registry} (the built-in ones and any a module of model.plugins registers)"


@dataclass
class DatasetConfig:
    path: str = _f("codex-m", "preprocessed dataset directory, or the name of the bundled dataset 'codex-m'")


@dataclass
class ModelConfig:
    plugins: str = _f("",
        "modules that register plug-ins, imported before the rest of the config is checked: comma-separated "
        "module names or .py paths (a YAML list too); a run records them, so eval, export and --resume import "
        "them again")
    decoder: str = _f("complex", f"scoring function, {_plugin_help('decoder', 'mp.DECODERS')}")
    dim: int = _f(256, "embedding dimension (real numbers per node; complex decoders use dim/2 complex pairs)")
    init_scale: float = _f(1e-3, "standard deviation of the normal initialisation")
    norm: int = _f(1,
        "distance norm of transe and rotate, 1 or 2 (rotate's 1 sums the complex moduli of h*r - t, as Sun et "
        "al.; 2 is scored on matmuls and wants another model.reg_weight)")
    loss: str = _f("softmax_ce", f"training loss, {_plugin_help('loss', 'mp.LOSSES')}")
    margin: float = _f(1.0, "margin of the margin ranking loss")
    regularizer: str = _f("n3", f"regulariser on the batch's embeddings, "
                                f"{_plugin_help('regulariser', 'mp.REGULARIZERS')}")
    reg_weight: float = _f(0.0, "weight of the regulariser (0 disables it)")
    dropout: float = _f(0.0, "dropout on the query embedding op(h, r) during training")


@dataclass
class TrainingConfig:
    epochs: int = _f(20, "number of passes over the training edges")
    batch_size: int = _f(1000, "edges per batch")
    num_chunks: int = _f(1, "a batch is split into this many chunks; each chunk shares its negatives")
    num_negatives: int = _f(1000, "negatives per chunk and direction; -1 scores against every node")
    negative_sampler: str = _f("uniform", "how negatives are drawn, "
                                          f"{_plugin_help('sampler', 'mp.NEGATIVE_SAMPLERS')}; uniform: "
                                          "uniform over the nodes, training.degree_fraction of them from the "
                                          "batch's endpoints")
    degree_fraction: float = _f(0.0, "fraction of negatives taken from the batch's own endpoints (degree-based)")
    lr: float = _f(0.1, "Adagrad learning rate of the node embeddings")
    adagrad_variant: str = _f("full", f"node Adagrad state, one of {ADAGRAD_VARIANTS} (rowwise: one accumulator per row)")
    relation_optimizer: str = _f("adagrad", f"optimizer of relation parameters, one of {RELATION_OPTIMIZERS}")
    relation_lr: float = _f(0.1, "learning rate of the relation parameters")
    seed: int = _f(0, "seed of every random draw (initialisation, shuffling, negatives, dropout)")
    device: str = _f("auto", f"compute device, one of {DEVICES} (auto: cuda when present)")
    devices: str = _f("",
        "several devices training one model, comma-separated: cuda:0,cuda:1 (or --gpus 2); cpu,cpu simulates "
        "two on a CPU. Each step trains one batch of training.batch_size per device; empty: training.device "
        "alone")
    relation_prediction: float = _f(0.0, "weight of the relation-prediction objective (Chen et al., AKBC 2021): "
                                          "each edge's relation predicted from its head and tail by a softmax over "
                                          "all relation vectors, both directions (decoders linear in the relation, "
                                          "such as distmult and complex); 0: off")
    shared_negatives: bool = _f(False,
        "several devices: the batches of a step draw the same uniform negatives, so each negative row is read "
        "from the host once per step (degree-based negatives stay per device)")
    num_threads: int = _f(0, "torch CPU threads (0: leave torch's default)")
    tensorboard: bool = _f(False, "also write the metrics as TensorBoard events to RUN_DIR/tensorboard (needs the "
                                  "tensorboard package: the tensorboard extra)")
    callbacks: str = _f("", "callbacks run while training: comma-separated names (a YAML list too) registered "
                            "in marius_py.callbacks.CALLBACKS, tensorboard among them; looked up when training starts")
    checkpoint_interval: float = _f(0.0,
        "seconds between checkpoint commits: an epoch commits when this long has passed, validation found a "
        "new best, or it is the last epoch; out of core a commit may also fall between two buffer states. 0: "
        "every epoch, never inside one")
    score_dtype: str = _f("float32", "precision of the [batch x negatives] score block of dot-product decoders "
                                     "with softmax_ce: float32 or bfloat16 (half the memory traffic; reductions "
                                     "stay float32); TransE and RotatE blocks stay float32")
    tf32: bool = _f(True, "CUDA: TF32 matmuls while training (scores; evaluation stays float32)")
    fused_step: bool = _f(True, "on CUDA, the built-in decoders with softmax_ce (N3/L2 and dropout included): a "
                                "step with hand-written gradients (marius_py/step/fused.py, edge_kernels.py) "
                                "instead of autograd; same results, several times fewer kernels. Plug-ins "
                                "without its kernels train on autograd, as the plan says")
    cuda_graphs: bool = _f(True, "with the fused step on CUDA: replay each full batch as one CUDA graph "
                                 "(same results; removes the host's kernel-launch time)")


@dataclass
class EvaluationConfig:
    protocol: str = _f("filtered", f"link-prediction protocol, one of {EVAL_PROTOCOLS}")
    every: int = _f(5, "validate every this many epochs (0: only at the end)")
    batch_size: int = _f(1024, "queries scored at once against all nodes (bounds memory)")
    num_negatives: int = _f(1000, "sampled protocol: negatives per query")
    negative_sampling: str = _f("uniform", f"sampled protocol: one of {NEGATIVE_KINDS} (mixed: half of "
                                           "num_negatives uniform, half by train degree; Marius evaluates "
                                           "Freebase86m with num_negatives=2000 this way)")
    early_stopping_patience: int = _f(0, "stop after this many validations without improvement (0: never)")
    select_best: bool = _f(True, "test with the checkpoint of best validation MRR rather than the last")


@dataclass
class StorageConfig:
    num_partitions: int = _f(0, "node partitions on disk (1: embeddings wholly in memory; 0: the plan chooses from the "
                                "graph's size and the machine's memory, see marius-py plan)")
    dtype: str = _f("auto",
        f"how node embeddings and their Adagrad state are stored, one of {STORAGE_DTYPES}: bfloat16 halves "
        "their memory and IO (float32 updates, rounded stochastically; one device, not under torchrun), auto "
        "picks it for partitions on disk and float32 in memory. A run keeps the dtype it started with")
    buffer_capacity: int = _f(0, "partitions held in memory at once when num_partitions > 1 (0: the plan "
                                 "chooses, all of them where they fit)")
    memory_limit_gib: float = _f(0.0, "the most memory, in GiB, the plan may give the node tables or the "
                                      "partition buffer, in GPU or host memory (0: what the machine has free)")
    ordering: str = _f("comet",
        f"order of buffer states and buckets, {_plugin_help('ordering', 'mp.ORDERINGS')}: beta needs the least "
        "IO, comet runs BETA over groups of partitions regrouped every epoch, affine walks the lines of an "
        "affine plane (P = C^2). See the out-of-core guide for their IO and accuracy")
    edge_assignment: str = _f("bucket",
        "which state trains an edge: bucket (the ordering's assignment), balanced (whole buckets, evening the "
        "edges per state at the same IO) or edge (each edge to a random state holding its bucket)")
    lookahead: int = _f(2, "buffer states whose admitted partitions are read ahead; each costs one more "
                           "partition of memory (a group with comet)")
    direct_io: str = _f("auto",
        "partition IO bypasses the page cache (O_DIRECT where the file system allows): true, false, or auto "
        "(true)")
    io_threads: int = _f(1,
        "threads reading partitions into the buffer, and as many writing them back")
    group_size: int = _f(0,
        "comet and affine: physical partitions per logical one, regrouped every epoch. 0: automatic (comet: "
        "the largest k <= 8 dividing the partitions and the buffer; affine: buffer_capacity^2 / "
        "num_partitions)")
    partition_split: int = _f(0,
        "comet and affine with an automatic group size: each partition (and buffer slot) is stored as this "
        "many physical ones, at the same memory and bytes read, so that groups can be regrouped every epoch. "
        "0: automatic (at most 8, lowered for small graphs, 1 under torchrun); a run's config.yaml records "
        "the split applied")


@dataclass
class PipelineConfig:
    placement: str = _f("auto",
        f"where node embeddings (or the partition buffer) live on CUDA, one of {PLACEMENTS}: device (GPU "
        "memory), host (pinned host memory) or auto (device where they fit). Several GPUs: replicated (a copy "
        "on each) or split (a share on each); device and auto replicate where each GPU holds the tables")
    staleness_bound: int = _f(0,
        "batches in flight at once: a batch's compute misses the updates of at most bound - 1 earlier ones "
        "(1: synchronous; with tables in GPU memory, how far batches are planned ahead). 0: 16 on CUDA, 1 on "
        "a CPU, 2 steps with several devices (at most 2 with replicated tables or CUDA graphs)")
    load_threads: int = _f(1, "threads of the load stage (negatives, unique rows, gathers)")
    queue_size: int = _f(0, "capacity of each queue between stages (0: the staleness bound)")
    dedup: str = _f("auto",
        "several devices sharing host tables: true reads each row a step needs once over PCIe (its owner "
        "shares it over NVLink), false lets every device read its own rows; auto times a few steps of each "
        "and keeps the faster (true on a CPU and with split tables)")
    step_grouping: int = _f(0, "several devices: windows of this many steps are sorted by head and each step "
                               "dealt round-robin, so the batches that run together share rows (0: off; the "
                               "batches are then uniform samples of the span)")
    processes: str = _f("one", f"several devices with replicated tables, one of {PROCESS_MODELS}: one process "
                               "drives every device, or a process per device (gradients gathered by NCCL)")
    cache_rows: int = _f(-1, "several devices, tables in host memory: rows each device keeps in its memory for "
                             "a span (its most frequent endpoints), read and updated there instead of over PCIe; "
                             "-1: as many as fit in a quarter of the device's free memory (none on a CPU); 0: none")


@dataclass
class DistributedConfig:
    relation_sync_seconds: float = _f(0.1, "several trainers (torchrun): every trainer's changes to the relation "
                                           "parameters reach the others by an all-reduce at least this often "
                                           "(applied at the next bucket boundary), and exactly at the end of "
                                           "every epoch")
    partitions_per_trainer: int = _f(0,
        "several trainers: partitions each trainer holds at once; more mean fewer partitions handed over per "
        "bucket. 0: automatic (as many as leave half the partitions free for the others to be granted, at "
        "least 2)")
    timeout_seconds: float = _f(600.0, "several trainers: how long a trainer waits for the others (the "
                                       "scheduler, a collective, rank 0's evaluation) before it stops the "
                                       "group with an error")


@dataclass
class Config:
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    evaluation: EvaluationConfig = field(default_factory=EvaluationConfig)
    storage: StorageConfig = field(default_factory=StorageConfig)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)

    def to_dict(self) -> dict:
        """The config as the user gave it (validation changes nothing; ``storage_layout`` resolves the store)."""
        return dataclasses.asdict(self)


CONFIG_SECTIONS = tuple(f.name for f in dataclasses.fields(Config))


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
        for name, kind in _section_types(values).items():
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


def device_list(devices: str) -> list[str]:
    """``training.devices`` as a list of device names ([] when unset)."""
    return [name.strip() for name in devices.split(",") if name.strip()] if devices.strip() else []


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
    layout = storage_layout(s)
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


@dataclass(frozen=True)
class StorageLayout:
    """The store a run uses, resolved once from ``storage.*`` (which validation leaves as the user gave it)
    and, where known, the graph's size: the same names, in physical units."""

    num_partitions: int     # the user's partitions times the split
    buffer_capacity: int    # the buffer's slots, likewise
    group_size: int         # physical partitions per group (two-level orderings), the automatic one resolved
    partition_split: int    # physical partitions per partition the user gave
    ordering: str
    dtype: str              # float32 or bfloat16 (``storage.dtype=auto`` resolved)

    @property
    def swap_size(self) -> int:
        """Partitions the buffer swaps together: a group under a two-level ordering, else one."""
        return self.group_size if is_two_level(self.ordering) else 1


def epoch_ordering(layout: StorageLayout, seed: int, epoch: int) -> Ordering:
    """An epoch's ordering over a store's partitions (seeded by training.seed and the epoch)."""
    group = layout.swap_size
    options = {"group_size": group} if is_two_level(layout.ordering) else {}
    return build_ordering(layout.ordering, layout.num_partitions // group, layout.buffer_capacity // group,
                          seed=seed, epoch=epoch, **options)


def storage_layout(s: StorageConfig, num_nodes: int | None = None, several_devices: bool = False) -> StorageLayout:
    """The physical store of ``storage.*``: the split applied (``storage.partition_split``; automatic: chosen
    for regrouping, 1 under torchrun, and with ``num_nodes`` lowered until the nodes fill every physical
    partition), the buffer's default (all partitions), the automatic group size, and the dtype (auto:
    bfloat16 for partitions on disk, unless ``several_devices`` or torchrun trainers exchange them)."""
    from marius_py.distributed.group import launched_by_torchrun  # (the package imports this module)
    buffer = s.buffer_capacity or s.num_partitions
    split = _split_for_regrouping(s, buffer)
    if num_nodes is not None and split > 1:
        split = _filled_split(s, split, num_nodes)
    partitions, buffer = s.num_partitions * split, buffer * split
    group = s.group_size or automatic_group_size(s.ordering, partitions, buffer)
    dtype = s.dtype
    if dtype == "auto":
        dtype = "bfloat16" if partitions > 1 and not several_devices and not launched_by_torchrun() else "float32"
    return StorageLayout(partitions, buffer, group, split, s.ordering, dtype)


def dedup_setting(value) -> bool | str:
    """``pipeline.dedup`` as the runners take it: True, False or "auto" (a Python bool set on a config object
    counts as its name)."""
    name = str(value).lower()
    return "auto" if name == "auto" else name in ("true", "1", "yes")


def run_layout(config: Config, num_nodes: int | None = None) -> StorageLayout:
    """``storage_layout`` of a run's config (its devices decide whether auto may store bfloat16)."""
    return storage_layout(config.storage, num_nodes, several_devices=len(device_list(config.training.devices)) > 1)


def with_split_applied(config: Config, layout: StorageLayout) -> Config:
    """``config`` as a run saves it (config.yaml): as given, with the split and dtype its store took pinned,
    so that a resume resolves the same store."""
    storage = dataclasses.replace(config.storage, partition_split=layout.partition_split, dtype=layout.dtype)
    return dataclasses.replace(config, storage=storage)


def _split_for_regrouping(s: StorageConfig, buffer: int) -> int:
    """``storage.partition_split`` (module field help) before fitting it to the graph."""
    from marius_py.distributed.group import launched_by_torchrun  # (the package imports this module)
    if s.group_size or not is_two_level(s.ordering):
        return max(s.partition_split, 1) if s.group_size else 1
    if s.partition_split:
        return s.partition_split
    chosen = default_split if s.ordering == "comet" else affine_split
    return 1 if launched_by_torchrun() else chosen(s.num_partitions, buffer)


def _filled_split(s: StorageConfig, split: int, num_nodes: int) -> int:
    """``split`` where the nodes fill every partition it makes: the automatic one is lowered until they do,
    one the user gave is refused, naming the largest that works."""
    largest = next((m for m in range(split, 1, -1)
                    if partitions_filled(num_nodes, s.num_partitions * m) == s.num_partitions * m), 1)
    if largest < split and s.partition_split:
        raise MariusInputError(f"storage.partition_split={split} stores {s.num_partitions} x {split} partitions, "
                               f"but the {num_nodes:,} nodes leave the last of them empty",
                               expected=f"storage.partition_split={largest} (the largest up to {split} whose "
                                        f"partitions they all fill), or 0 (automatic)")
    return largest


def automatic_group_size(ordering: str, num_physical: int, buffer: int) -> int:
    """``storage.group_size=0``: comet's default (``default_group_size``), or for affine the k that makes
    the logical partitions the square of those in the buffer."""
    if ordering == "affine" and buffer < num_physical:
        return affine_group_size(num_physical, buffer)
    return default_group_size(num_physical, buffer)


def _coerce(value, annotation, path: str, source, line: int | None = None):
    """Convert a YAML or command-line value to the schema's type (``line``: where the file sets it)."""
    kind = {"int": int, "float": float, "str": str, "bool": bool}[annotation]
    if kind is bool:
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        if isinstance(value, bool):
            return value
    elif kind is float and isinstance(value, (int, float, str)) and not isinstance(value, bool):
        try:
            return float(value)
        except ValueError:
            pass
    elif kind is int and not isinstance(value, bool):
        try:
            # (an int past 2^53 differs from its float)
            if isinstance(value, (str, numbers.Integral)) or float(value) == int(value):
                return int(value)
        except (TypeError, ValueError, OverflowError):  # (OverflowError: int(inf))
            pass
    elif kind is str and isinstance(value, bool):  # (YAML's true and false, for keys that take auto/true/false)
        return str(value).lower()
    elif kind is str and path in LIST_KEYS and isinstance(value, list) and all(isinstance(v, str) for v in value):
        return ",".join(value)
    elif kind is str and isinstance(value, (str, int, float)):
        return str(value)
    raise MariusInputError(f"{path}: expected {annotation}, got {value!r}", path=source, line=line)


def _section_types(section) -> dict[str, str]:
    """The type name of every key of a section (a section's class or instance)."""
    hints = typing.get_type_hints(section if isinstance(section, type) else type(section))
    return {f.name: hints[f.name].__name__ for f in dataclasses.fields(section)}


def key_type(dotted: str, source: object = None, line: int | None = None) -> str:
    """The type name (int, float, str, bool) of config key ``section.key``; an unknown key is an error naming
    ``source`` and ``line`` and the keys there are."""
    parts = dotted.split(".")
    sections = {f.name: f.default_factory for f in dataclasses.fields(Config)}
    if len(parts) != 2 or parts[0] not in sections:
        raise MariusInputError(f"unknown config key {dotted!r}", path=source, line=line,
                               expected=f"section.key with section one of {', '.join(sorted(CONFIG_SECTIONS))}")
    types = _section_types(sections[parts[0]])
    if parts[1] not in types:
        raise MariusInputError(f"unknown config key {dotted!r}", path=source, line=line,
                               expected=f"one of {', '.join(parts[0] + '.' + k for k in types)}")
    return types[parts[1]]


def coerce_key(dotted: str, value, source: object = None, line: int | None = None):
    """``value`` converted to the type of config key ``dotted`` (errors name ``source`` and ``line``)."""
    return _coerce(value, key_type(dotted, source, line), dotted, source, line)


def _set(config: Config, dotted: str, value, source, line: int | None = None) -> None:
    if dotted in REMOVED_KEYS:
        _check_removed(dotted, value, source, line)
        return
    value = coerce_key(dotted, value, source, line)  # (refuses an unknown key)
    section, key = dotted.split(".")
    setattr(getattr(config, section), key, value)


# storage.negative_cache and its three policies were removed. An earlier run's config.yaml names them: off
# (0), it loads as before, whatever its policies said; on, it is refused, saying why and how to go on.
REMOVED_KEYS = ("storage.negative_cache", "storage.negative_cache_refresh", "storage.negative_cache_gradients",
                "storage.negative_cache_draws")
_REMOVED_WHY = ("storage.negative_cache was removed: measured on CoDEx-M and FB15k-237, it brought no ordering "
                "closer to in-memory accuracy (docs/design.md)")

# model.transe_norm and model.rotate_norm (each decoder its own) became model.norm. An earlier run's
# config.yaml holds both: the final decoder's own one becomes model.norm, unless model.norm is given at the
# same level or later (the command line is later than the file), with a warning that the names go.
OLD_NORM_KEYS = {"model.transe_norm": "transe", "model.rotate_norm": "rotate"}


# storage.comet_group_size and storage.comet_split also serve affine: renamed, the old names still read.
RENAMED_KEYS = {"storage.comet_group_size": "storage.group_size", "storage.comet_split": "storage.partition_split"}


def _renamed(dotted: str, source) -> str:
    """The current name of a key (an old name warns that it goes)."""
    if dotted not in RENAMED_KEYS:
        return dotted
    warnings.warn(f"{source}: {dotted} is now {RENAMED_KEYS[dotted]}; the old name will be refused in a later "
                  "release", FutureWarning, stacklevel=4)
    return RENAMED_KEYS[dotted]


def _check_removed(dotted: str, value, source, line: int | None = None) -> None:
    """Refuse a removed key that would turn the negative cache on."""
    if dotted != "storage.negative_cache":
        return
    try:
        off = float(value) == 0.0
    except (TypeError, ValueError):
        off = False
    if not off:
        raise MariusInputError(f"{dotted}={value!r}: {_REMOVED_WHY}", path=source, line=line,
                               expected=f"no {dotted}, or 0 (a run trained with it continues without it once its "
                                        f"config.yaml says {dotted}: 0.0)")


def _old_norms(values: dict, level: int, source, found: dict) -> dict:
    """``values`` (a model section) without the old norm keys, which go to ``found`` as (level, value)."""
    for key in [k for k in values if f"model.{k}" in OLD_NORM_KEYS]:
        found[f"model.{key}"] = (level, values[key], source)
    return {key: value for key, value in values.items() if f"model.{key}" not in OLD_NORM_KEYS}


def _resolve_old_norms(config: Config, found: dict, norm_level: int | None) -> None:
    """model.norm from the old key of the final decoder (``found``: key -> (level, value, source)), unless
    model.norm was given at the same level or later (``norm_level``)."""
    if not found:
        return
    sources = {str(source) for _, _, source in found.values()}
    warnings.warn(f"{', '.join(sorted(sources))}: {' and '.join(sorted(found))} "
                  f"{'is' if len(found) == 1 else 'are'} now model.norm (one distance norm for transe and rotate); "
                  "the old names will be refused in a later release", FutureWarning, stacklevel=3)
    own = next((key for key, decoder in OLD_NORM_KEYS.items() if decoder == config.model.decoder), None)
    if own in found and (norm_level is None or found[own][0] > norm_level):
        level, value, source = found[own]
        _set(config, "model.norm", value, source)


def from_dict(raw: dict, source: object = None, lines: dict[str, int] | None = None,
              old_norms: dict | None = None) -> Config:
    """Build a config from nested dicts (unknown keys are errors); ``lines``: the line of every section and
    ``section.key`` in ``source``, for errors; ``old_norms`` collects the model section's old norm keys
    (``load_config`` resolves them once every override is in)."""
    config = Config()
    lines = lines or {}
    if raw is None:
        return config
    if not isinstance(raw, dict):
        raise MariusInputError(f"config is a {_yaml_kind(raw)}, not a mapping of sections", path=source,
                               line=lines.get(""), expected="YAML like 'training: {lr: 0.1}'")
    for section, values in raw.items():
        line = lines.get(str(section))
        if values is None:  # 'training:' with every key commented out
            continue
        if not isinstance(values, dict):
            if isinstance(section, str) and "." in section and section.split(".")[0] in CONFIG_SECTIONS:
                head, key = section.split(".", 1)
                expected = f"nested sections: '{head}:' and under it '  {key}: ...'"
            elif section in CONFIG_SECTIONS:
                expected = f"a mapping of keys, e.g. '{section}: {{key: value}}'"
            else:
                expected = f"a mapping of sections, one of {', '.join(CONFIG_SECTIONS)}"
            raise MariusInputError(f"config section {section!r} is a {_yaml_kind(values)}, not a mapping",
                                   path=source, line=line, expected=expected)
        if section == "model":
            values = _old_norms(values, 0, source, old_norms if old_norms is not None else {})
        for key, value in values.items():
            dotted = f"{section}.{key}"
            _set(config, _renamed(dotted, source), value, source, lines.get(dotted))
    return config


def _yaml_kind(value) -> str:
    return {list: "list", str: "string", bool: "boolean", int: "number", float: "number"}.get(type(value),
                                                                                             type(value).__name__)


def apply_overrides(config: Config, overrides: list[str], source: object = "overrides",
                    old_norms: dict | None = None) -> Config:
    """Apply ``section.key=value`` strings (values parsed as YAML scalars); ``source``: where they came from,
    as errors name it (the CLI's: "command line"); ``old_norms`` collects old norm keys (see from_dict)."""
    for item in overrides:
        key, text = _split_override(item, source)
        try:
            value = yaml.safe_load(text) if text else ""
        except yaml.YAMLError:
            value = text
        if key in OLD_NORM_KEYS:
            (old_norms if old_norms is not None else {})[key] = (1, value, source)
            continue
        _set(config, _renamed(key, source), value, source)
    return config


_OVERRIDE_KEY = re.compile(r"\s*([A-Za-z_]\w*)\.([A-Za-z_]\w*)\s*")


def is_override_key(item: str) -> bool:
    """Whether ``item`` without ``=`` is shaped like ``section.key`` (an override missing its value) rather
    than a config file's name (``training.yaml`` is one)."""
    match = _OVERRIDE_KEY.fullmatch(item)
    return bool(match) and match.group(1) in CONFIG_SECTIONS and match.group(2).lower() not in ("yaml", "yml")


def _split_override(item: str, source: object) -> tuple[str, str]:
    """(key, value text) of a ``section.key=value`` override."""
    if "=" in item:
        key, text = item.split("=", 1)
        return key.strip(), text
    if is_override_key(item):
        raise MariusInputError(f"override {item!r} has no value", path=source, expected=f"{item.strip()}=VALUE")
    raise MariusInputError(f"bad override {item!r}", path=source, expected="section.key=value, e.g. training.lr=0.05")


class _DuplicateKey(yaml.constructor.ConstructorError):
    pass


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key given twice in one mapping (PyYAML would keep the last)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            first_lines: dict = {}
            for key_node, _ in node.value:
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # (merge keys '<<' may be overridden; complex keys fail as unhashable)
                key = self.construct_object(key_node)
                if key in first_lines:
                    raise _DuplicateKey(None, None, f"duplicate key {key!r} (first on line {first_lines[key]})",
                                        key_node.start_mark)
                first_lines[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


@dataclass(frozen=True)
class YamlKind:
    """What a YAML file holds, as ``read_yaml``'s errors name it."""

    noun: str     # "config file"
    shape: str    # what a valid file is: "a YAML mapping of sections"
    example: str  # said after the shape when the file is empty


CONFIG_YAML = YamlKind("config file", "a YAML mapping of sections",
                       "like 'training: {lr: 0.1}' (give no config for the defaults)")


def read_yaml(path: Path, kind: YamlKind = CONFIG_YAML) -> tuple[object, dict[str, int]]:
    """A YAML file's value (UTF-8, or UTF-16 with a byte-order mark) and the line of every top-level key and
    of every ``key.subkey`` (a config's sections and ``section.key``); errors name the file and line."""
    raw, lines, _ = read_yaml_text(path, kind)
    return raw, lines


def read_yaml_text(path: Path, kind: YamlKind = CONFIG_YAML) -> tuple[object, dict[str, int], str]:
    """``read_yaml``'s value and lines, and the file's text: the file is read once (a pipe can be read only
    once)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise MariusInputError(f"{kind.noun} not found", path=path) from None
    except OSError as error:
        raise MariusInputError(f"cannot read the {kind.noun} ({error.strerror or error})", path=path,
                               expected="a readable YAML file") from None
    loader = None
    try:
        loader = _UniqueKeyLoader(data)  # (decodes the start already)
        node = loader.get_single_node()
        raw = None if node is None else loader.construct_document(node)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = "not valid YAML: " + " ".join(str(getattr(error, "problem", None) or error).split())
        expected = "each key once in a section" if isinstance(error, _DuplicateKey) else kind.shape
        if isinstance(error, yaml.reader.ReaderError):  # not UTF-8, or a control character (NUL...)
            line = data[:error.position].count(b"\n") + 1  # (approximate past non-ASCII text)
            if error.encoding == "unicode":
                problem, expected = f"character #x{error.character:04x} ({error.reason})", "printable text"
            else:
                problem, expected = f"not UTF-8: byte 0x{error.character:02x} ({error.reason})", \
                    "UTF-8 text, or UTF-16 with a byte-order mark"
        raise MariusInputError(problem, path=path, line=line, expected=expected) from None
    except RecursionError:
        raise MariusInputError("not valid YAML: nested too deeply", path=path, expected=kind.shape) from None
    finally:
        if loader is not None:
            loader.dispose()
    if node is None:
        raise MariusInputError(f"{kind.noun} is empty (no settings)", path=path,
                               expected=f"{kind.shape} {kind.example}")
    return raw, _node_lines(node), data.decode("utf-8", errors="replace")


def _node_lines(root) -> dict[str, int]:
    """1-based line of the document (key ""), of every section and of every ``section.key`` of a composed
    YAML document."""
    lines = {"": root.start_mark.line + 1}
    if isinstance(root, yaml.MappingNode):
        for section, body in root.value:
            lines[str(section.value)] = section.start_mark.line + 1
            if isinstance(body, yaml.MappingNode):
                for key, _ in body.value:
                    lines[f"{section.value}.{key.value}"] = key.start_mark.line + 1
    return lines


def load_config(path: str | Path | None = None, overrides: list[str] | None = None,
                source: object = "overrides") -> Config:
    """Read a YAML config (or the defaults), apply overrides, validate. ``source``: where the overrides came
    from, as errors about them name it (the CLI's: "command line")."""
    config = Config()
    origins: dict = {}
    old_norms: dict = {}
    norm_level = None  # where model.norm itself was given: 0 the file, 1 the overrides
    if path is not None:
        path = Path(path)
        raw, lines = read_yaml(path)
        config = from_dict(raw, source=path, lines=lines, old_norms=old_norms)
        origins.update({RENAMED_KEYS.get(key, key): (path, line) for key, line in lines.items()})
        norm_level = 0 if "model.norm" in lines else None
    apply_overrides(config, overrides or [], source, old_norms)
    given = {RENAMED_KEYS.get(key, key) for key in (item.split("=", 1)[0].strip() for item in overrides or [])}
    origins.update({key: (source, None) for key in given})
    norm_level = 1 if "model.norm" in given else norm_level
    _resolve_old_norms(config, old_norms, norm_level)
    for key, (level, _, where) in old_norms.items():  # (errors about model.norm name where it came from)
        origins.setdefault("model.norm", origins.get(key, (where, None)))
    return validate(config, origins)


def with_overrides(config: Config, overrides: list[str], source: object = "overrides",
                   origins: dict | None = None) -> Config:
    """A validated copy of ``config`` with ``key=value`` overrides applied (``config`` itself is unchanged);
    ``origins`` as ``validate`` takes them."""
    return validate(apply_overrides(copy.deepcopy(config), overrides, source), origins)


def dump_config(config: Config) -> str:
    return yaml.safe_dump(config.to_dict(), sort_keys=False)


def describe_schema() -> str:
    """Every key with its default and help, for ``--help-config``; keys naming a plug-in list those registered
    now."""
    lines = []
    for section in dataclasses.fields(Config):
        instance = section.default_factory()
        for f in dataclasses.fields(instance):
            path = f"{section.name}.{f.name}"
            lines.append(f"{path} = {getattr(instance, f.name)!r}\n    {f.metadata['help']}")
            if path in PLUGIN_KEYS:
                lines.append(f"    registered: {', '.join(PLUGIN_KEYS[path].names())}")
    return "\n".join(lines)
