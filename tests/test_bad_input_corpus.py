"""A corpus of user mistakes through the command line: configs and overrides, CLI arguments, edge files,
run directories and checkpoints. Each must exit with status 2 and one message (no traceback) that
names what was wrong, and leave nothing behind that looks like a valid output."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from marius_py.cli import main

UMLS_RAW = Path(__file__).parent / "data" / "umls"
# Every train case writes (if it wrongly ran) into {out}; settings come first, the bad one last wins.
TRAIN = "train dataset.path={raw} training.device=cpu model.dim=8 training.epochs=1"

CASES = {
    # configs and overrides
    "unknown_key": (f"{TRAIN} training.nope=1 --run-dir {{out}}", "unknown config key 'training.nope'"),
    "not_a_float": (f"{TRAIN} training.lr=abc --run-dir {{out}}", "training.lr: expected float, got 'abc'"),
    "negative_lr": (f"{TRAIN} training.lr=-1 --run-dir {{out}}", "training.lr: expected > 0"),
    "unknown_decoder": (f"{TRAIN} model.decoder=foo --run-dir {{out}}", "model.decoder: expected one of"),
    "unknown_loss": (f"{TRAIN} model.loss=hinge --run-dir {{out}}", "model.loss"),
    "unknown_regularizer": (f"{TRAIN} model.regularizer=l7 --run-dir {{out}}", "model.regularizer"),
    "unknown_adagrad": (f"{TRAIN} training.adagrad_variant=sparse --run-dir {{out}}", "training.adagrad_variant"),
    "zero_dim": (f"{TRAIN} model.dim=0 --run-dir {{out}}", "model.dim: expected > 0"),
    "odd_complex_dim": (f"{TRAIN} model.decoder=complex model.dim=7 --run-dir {{out}}", "expected even for complex"),
    "zero_batch": (f"{TRAIN} training.batch_size=0 --run-dir {{out}}", "training.batch_size: expected > 0"),
    "negative_epochs": (f"{TRAIN} training.epochs=-2 --run-dir {{out}}", "training.epochs: expected > 0"),
    "dropout_one": (f"{TRAIN} model.dropout=1.5 --run-dir {{out}}", "model.dropout: expected in [0, 1)"),
    "score_dtype": (f"{TRAIN} training.score_dtype=float16 --run-dir {{out}}", "training.score_dtype"),
    "relation_prediction_transe": (f"{TRAIN} training.relation_prediction=1 model.decoder=transe "
                                   f"--run-dir {{out}}", "needs a decoder linear in the relation vector"),
    "unknown_device": (f"{TRAIN} training.device=tpu --run-dir {{out}}", "training.device"),
    "one_device_list": (f"{TRAIN} training.devices=cuda:0 --run-dir {{out}}", "expected at least two devices"),
    "unknown_protocol": (f"{TRAIN} evaluation.protocol=nope --run-dir {{out}}", "evaluation.protocol"),
    "buffer_of_one": (f"{TRAIN} storage.num_partitions=4 storage.buffer_capacity=1 --run-dir {{out}}",
                      "storage.buffer_capacity: expected between 2"),
    "unknown_ordering": (f"{TRAIN} storage.ordering=nope --run-dir {{out}}", "storage.ordering"),
    "group_leaving_one_group": (f"{TRAIN} storage.num_partitions=16 storage.buffer_capacity=4 "
                                f"storage.group_size=4 --run-dir {{out}}", "storage.group_size"),
    "more_partitions_than_nodes": (f"{TRAIN} storage.num_partitions=1000 storage.buffer_capacity=2 "
                                   f"--run-dir {{out}}", "at most"),
    "missing_config_file": ("train {tmp}/nope.yaml dataset.path={raw} --run-dir {out}", "config file not found"),
    # (a missing config named like a section.key: a file name still, not an override without its value)
    "missing_config_named_like_a_key": ("train training.yaml dataset.path={raw} --run-dir {out}",
                                        "training.yaml: config file not found"),
    "missing_yml_config_named_like_a_key": ("train model.yml dataset.path={raw} --run-dir {out}",
                                            "model.yml: config file not found"),
    "override_without_value": (f"{TRAIN} training.epochs --run-dir {{out}}",
                               "command line: override 'training.epochs' has no value"),
    "override_without_value_after_a_config": ("train codex-s training.epochs dataset.path={raw} --run-dir {out}",
                                              "override 'training.epochs' has no value"),
    "yaml_syntax": ("train {syntax} dataset.path={raw} --run-dir {out}", "not valid YAML"),
    "unknown_section": ("train {section} dataset.path={raw} --run-dir {out}", "unknown config key 'nosection.x'"),
    "missing_dataset": ("train dataset.path={tmp}/nope training.device=cpu --run-dir {out}",
                        "dataset.path: not a dataset"),
    # command-line arguments
    "negative_partitions_flag": (f"{TRAIN} --partitions -1 --run-dir {{out}}", "storage.num_partitions: expected >= 0"),
    "zero_gpus": (f"{TRAIN} --gpus 0 --run-dir {{out}}", "--gpus 0"),
    "export_format": ("export {run} --format xml -o {out}", "invalid choice: 'xml'"),
    "eval_checkpoint": ("eval {run} --checkpoint nope", "invalid choice: 'nope'"),
    "eval_model_override": ("eval {run} model.decoder=transe", "eval takes only evaluation.* overrides"),
    "predict_no_anchor": ("predict {run} --relation x", "give exactly one of head and tail"),
    "predict_both_anchors": ("predict {run} --relation x --head y --tail z", "give exactly one of head and tail"),
    "predict_unknown_node": ("predict {run} --relation nope --head nobody", "unknown node name 'nobody'"),
    "ordering_buffer_too_big": ("ordering --partitions 4 --buffer 8", "expected 2 <= --buffer <= --partitions"),
    "export_unwritable": ("export {run} -o {file}/out", "cannot create the output directory"),
    # edge files
    "preprocess_missing_file": ("preprocess --train {tmp}/missing.txt -o {out}", "input file not found"),
    "preprocess_short_line": ("preprocess --train {short} -o {out}", "short.txt:1"),
    "preprocess_into_a_run": ("preprocess --train {raw}/train.txt -o {run}", "output directory exists"),
    "preprocess_bad_split": ("preprocess --train {raw}/train.txt --split a,b -o {out}", "--split: cannot read"),
    # run directories and checkpoints
    "resume_missing_run": ("train --resume {tmp}/nope", "not a run directory"),
    "resume_other_model": ("train --resume {run} model.dim=16", "different model or dataset"),
    "train_over_a_run": (f"{TRAIN} --run-dir {{run}}", "run directory already holds a run"),
    "eval_missing_run": ("eval {tmp}/nope", "not a run directory"),
    "verify_missing_run": ("verify {tmp}/nope", "no committed checkpoint"),
    "info_missing_path": ("info {tmp}/nope", "not a preprocessed dataset"),
}


@pytest.fixture(scope="module")
def places(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("corpus")
    run = tmp / "run"
    assert main(shlex.split(TRAIN.format(raw=UMLS_RAW)) + ["--run-dir", str(run), "--quiet"]) == 0
    (tmp / "syntax.yaml").write_text("training:\n  lr: [1\n")
    (tmp / "section.yaml").write_text("nosection:\n  x: 1\n")
    (tmp / "short.txt").write_text("a\tr\n")
    (tmp / "a-file").write_text("not a directory\n")
    return {"tmp": tmp, "raw": UMLS_RAW, "run": run, "syntax": tmp / "syntax.yaml",
            "section": tmp / "section.yaml", "short": tmp / "short.txt", "file": tmp / "a-file"}


def test_corpus_has_forty_cases():
    assert len(CASES) >= 40


def run_cli(args: list[str]) -> int:
    """main's exit status, argparse's usage errors (SystemExit) included."""
    try:
        return main(args)
    except SystemExit as error:
        return error.code


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_input_is_one_clean_error(name, places, tmp_path, capsys):
    command, fragment = CASES[name]
    out = tmp_path / "out"
    run_files = sorted(p.relative_to(places["run"]) for p in places["run"].rglob("*"))
    code = run_cli(shlex.split(command.format(out=out, **places)))
    err = capsys.readouterr().err
    assert code == 2, err
    assert fragment in err and "Traceback" not in err
    assert not out.exists()  # nothing half-written
    assert sorted(p.relative_to(places["run"]) for p in places["run"].rglob("*")) == run_files
