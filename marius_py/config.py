"""The one typed config schema: dataclasses with a help string on every field.

A config is YAML with the sections below; ``key.sub=value`` overrides from the
command line are coerced through the schema, keys of earlier versions read as
``config_migration`` says, and every value is checked in
``config_validation.validate`` with an error naming the path
(``training.lr: expected > 0, got -1``); ``config_loading.load_config`` does all
three. The resolved config is saved next to every run's checkpoints.
"""

from __future__ import annotations

import dataclasses
import numbers
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from marius_py import orderings
from marius_py.config_migration import OLD_NORM_KEYS, REMOVED_KEYS, check_removed, current_name, without_old_norms
from marius_py.models import DECODERS, LOSSES, REGULARIZERS
from marius_py.negatives import NEGATIVE_SAMPLERS
from marius_py.orderings import OrderingSpec
from marius_py.errors import MariusInputError
from marius_py.registry import Registry, where_defined


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
EVAL_PROTOCOLS = ("filtered", "sampled", "given", "top10")
NEGATIVE_KINDS = ("uniform", "degree", "mixed")
PLACEMENTS = ("auto", "device", "host", "replicated", "split")
PROCESS_MODELS = ("one", "per_device")
AUTO_OR_BOOL = ("auto", "true", "false")  # keys that take auto, true or false
STORAGE_DTYPES = ("auto", "float32", "bfloat16")

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
    commits_behind: str = _f("auto", "write each commit on a thread while the next epoch trains (auto: where one "
                                     "process trains and host memory holds a snapshot of in-memory tables, as the "
                                     "plan says; true or false). A commit point that comes while one is written "
                                     "folds into the next; the last epoch's commit is waited for")
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
    protocol: str = _f("filtered", f"link-prediction protocol, one of {EVAL_PROTOCOLS} (given: against the "
                       "negatives the dataset gives each valid and test edge, as OGB's datasets do; top10: tails "
                       "against all nodes, MRR counted to the top 10, as WikiKG90Mv2's)")
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
    continue_epochs: bool = _f(False, "each epoch's ordering renamed to start with the partitions the last one "
                                      "ended with, which stay in the buffer: no epoch but the first waits for a "
                                      "state to be read, but the same partitions' buckets train twice in a row, "
                                      "which costs accuracy (docs/design.md)")
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


def device_list(devices: str) -> list[str]:
    """``training.devices`` as a list of device names ([] when unset)."""
    return [name.strip() for name in devices.split(",") if name.strip()] if devices.strip() else []


def dedup_setting(value) -> bool | str:
    """``pipeline.dedup`` as the runners take it: True, False or "auto" (a Python bool set on a config object
    counts as its name)."""
    name = str(value).lower()
    return "auto" if name == "auto" else name in ("true", "1", "yes")


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


def section_types(section) -> dict[str, str]:
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
    types = section_types(sections[parts[0]])
    if parts[1] not in types:
        raise MariusInputError(f"unknown config key {dotted!r}", path=source, line=line,
                               expected=f"one of {', '.join(parts[0] + '.' + k for k in types)}")
    return types[parts[1]]


def coerce_key(dotted: str, value, source: object = None, line: int | None = None):
    """``value`` converted to the type of config key ``dotted`` (errors name ``source`` and ``line``)."""
    return _coerce(value, key_type(dotted, source, line), dotted, source, line)


def set_key(config: Config, dotted: str, value, source, line: int | None = None) -> None:
    """Set config key ``dotted`` to ``value`` coerced to its type (a removed key is checked, then dropped)."""
    if dotted in REMOVED_KEYS:
        check_removed(dotted, value, source, line)
        return
    value = coerce_key(dotted, value, source, line)  # (refuses an unknown key)
    section, key = dotted.split(".")
    setattr(getattr(config, section), key, value)


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
            values = without_old_norms(values, 0, source, old_norms if old_norms is not None else {})
        for key, value in values.items():
            dotted = f"{section}.{key}"
            set_key(config, current_name(dotted, source), value, source, lines.get(dotted))
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
        set_key(config, current_name(key, source), value, source)
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
