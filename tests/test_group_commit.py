"""A group's commit (issue 41): every trainer prepares its version in its own run directory, the leader's
pointer file commits the group's, then the others point to theirs. A kill at any instant leaves the last
committed version readable: these tests stop the protocol between its steps (fast, in one process)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from marius_py.checkpoint import RunDirectory, TrainingState, check_holders, write_version_state
from marius_py.errors import MariusInputError


def prepared(run: RunDirectory, epoch: int) -> Path:
    tmp = run.begin_version(epoch)
    (tmp / "nodes").mkdir()
    write_version_state(tmp, {}, TrainingState(epoch=epoch))
    return run.prepare_version(tmp, epoch)


def committed(run: RunDirectory, epoch: int, keeps_best: bool = True) -> Path:
    version = prepared(run, epoch)
    run.point_to(version, is_best=keeps_best, keeps_best=keeps_best)
    return version


def test_a_prepared_version_is_not_committed_until_pointed_to(tmp_path):
    run = RunDirectory(tmp_path)
    run.checkpoints.mkdir(parents=True)
    first = committed(run, 1)
    second = prepared(run, 2)
    assert second.is_dir() and RunDirectory(tmp_path).latest_version() == first  # (a kill here: v1 stands)
    run.point_to(second, is_best=False)
    assert RunDirectory(tmp_path).latest_version() == second
    assert json.loads(run.pointer_file.read_text()) == {"latest": "v000002", "best": "v000001"}


def test_a_trainer_other_than_the_leader_keeps_its_latest_version_alone(tmp_path):
    run = RunDirectory(tmp_path)
    run.checkpoints.mkdir(parents=True)
    committed(run, 1, keeps_best=False)
    committed(run, 2, keeps_best=False)
    assert json.loads(run.pointer_file.read_text()) == {"latest": "v000002"}
    assert [v.name for v in run.versions_on_disk()] == ["v000002"]


def test_a_trainer_killed_before_pointing_adopts_the_version_its_group_committed(tmp_path):
    run = RunDirectory(tmp_path)
    run.checkpoints.mkdir(parents=True)
    committed(run, 1, keeps_best=False)
    second = prepared(run, 2)  # the leader's pointer committed v2; this trainer was killed before its own
    assert RunDirectory(tmp_path).adopt_version("v000002") == second
    assert RunDirectory(tmp_path).latest_version() == second
    assert [v.name for v in run.versions_on_disk()] == ["v000002"]


def test_a_version_written_for_a_commit_the_leader_never_made_is_dropped_on_adoption(tmp_path):
    """The trainer prepared v2 but the leader was killed before its pointer named it; this trainer's pointer
    file was lost too, so its own recovery would take v2: the group resumes v1, and v2 goes."""
    run = RunDirectory(tmp_path)
    run.checkpoints.mkdir(parents=True)
    first = committed(run, 1, keeps_best=False)
    prepared(run, 2)
    run.pointer_file.unlink()
    reopened = RunDirectory(tmp_path)
    assert reopened.latest_version().name == "v000002"  # (what recovery alone would pick)
    assert reopened.adopt_version("v000001") == first
    assert [v.name for v in RunDirectory(tmp_path).versions_on_disk()] == ["v000001"]


def test_adopting_a_version_the_trainer_lacks_is_refused_naming_it(tmp_path):
    run = RunDirectory(tmp_path)
    run.checkpoints.mkdir(parents=True)
    committed(run, 1, keeps_best=False)
    with pytest.raises(MariusInputError, match="the group's last commit is v000003, and this trainer's copy of "
                                               "it is missing") as caught:
        run.adopt_version("v000003")
    assert caught.value.path == str(run.checkpoints / "v000003")
    assert RunDirectory(tmp_path).latest_version().name == "v000001"  # nothing changed


def test_a_trainer_whose_group_committed_nothing_drops_what_it_prepared(tmp_path):
    run = RunDirectory(tmp_path)
    run.checkpoints.mkdir(parents=True)
    prepared(run, 1)
    run.drop_versions()
    assert not RunDirectory(tmp_path).has_checkpoint() and not run.versions_on_disk()


@pytest.mark.parametrize("holders, trainers, refused", [(None, 1, False), ([0, 0, 0], 1, False),
                                                        ([0, 1, 0], 1, True), ([0, 1, 2], 2, True),
                                                        ([0, 1, 2], 3, False)])
def test_a_version_spread_over_trainers_loads_only_with_as_many(tmp_path, holders, trainers, refused):
    state = TrainingState(epoch=2, holders=holders)
    if refused:
        with pytest.raises(MariusInputError, match="spread over the run directories of"):
            check_holders(state, trainers, tmp_path)
    else:
        check_holders(state, trainers, tmp_path)


class KilledAt(Exception):
    pass


class GroupKilledAtItsBarrier:
    """A group of one whose commit is cut at its first barrier: every trainer's version is written, and the
    leader dies before its pointer file names it."""

    rank, world_size, is_leader = 0, 1, True

    def barrier(self):
        raise KilledAt

    def all_gather(self, value):
        return [value]

    def broadcast(self, value):
        return value


def test_a_commit_cut_before_the_leaders_pointer_leaves_the_last_version_and_resumes_it(small_config, tmp_path):
    from marius_py.dataset import Dataset
    from marius_py.trainer import Trainer
    config = small_config("storage.num_partitions=2", "training.epochs=1")
    trainer = Trainer.of(config, Dataset(config.dataset.path), tmp_path / "run", progress=False)
    try:
        trainer.train()
        trainer.checkpointer.group = GroupKilledAtItsBarrier()  # (the group the commit runs in)
        trainer.state.epoch = 2
        with pytest.raises(KilledAt):
            trainer.save_checkpoint()
    finally:
        trainer.close()
    run = RunDirectory(tmp_path / "run")
    assert run.latest_version().name == "v000001" and (run.checkpoints / "v000002").is_dir()
    resumed = Trainer.of(config, Dataset(config.dataset.path), tmp_path / "run", progress=False)
    try:
        assert resumed.state.epoch == 1
    finally:
        resumed.close()
