"""The synchronous trainer (embeddings in memory, one partition).

One batch is two halves, as the pipeline will run them: ``compute_batch``
(sample negatives, score both directions, back-propagate, step the relation
optimizer, turn node gradients into additive Adagrad deltas) and
``SparseAdagrad.apply`` (add deltas and g^2 to the stored rows).

Randomness: every draw of epoch ``e`` comes from generators seeded with
``(seed, e)``, so resuming at an epoch boundary replays training exactly.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from marius_py.checkpoint import (NODES, RunDirectory, TrainingState, config_fingerprint,
                                  load_version, save_version, write_version_state)
from marius_py.config import Config
from marius_py.dataset import Dataset
from marius_py.errors import MariusInputError
from marius_py.evaluation import build_known_answers, evaluate_split
from marius_py.models import LOSSES, Decoder, build_decoder, regularization
from marius_py.negatives import chunk, sample_negatives
from marius_py.optim import SparseAdagrad, build_relation_optimizer
from storage.embedding_store import EmbeddingStore


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise MariusInputError("training.device: cuda requested but no CUDA device is available",
                               expected="training.device=cpu or auto")
    return torch.device(name)


def epoch_generator(seed: int, epoch: int, device: torch.device | str = "cpu") -> torch.Generator:
    """The generator of one epoch's random draws, independent of earlier epochs."""
    return torch.Generator(device=device).manual_seed(seed * 1_000_003 + epoch)


@dataclass
class BatchUpdate:
    rows: torch.Tensor      # unique node ids touched by the batch
    delta: torch.Tensor     # additive embedding update for those rows
    squared: torch.Tensor   # additive Adagrad state update (g^2)
    loss: torch.Tensor


class Model:
    """Decoder + losses + optimizers: everything but the node embeddings."""

    def __init__(self, config: Config, num_nodes: int, num_relations: int, device: torch.device):
        m, t = config.model, config.training
        self.config = config
        self.num_nodes = num_nodes
        self.decoder: Decoder = build_decoder(m.decoder, num_relations, m.dim, m.init_scale,
                                              m.transe_norm).to(device)
        self.loss_fn = LOSSES[m.loss]
        self.node_optimizer = SparseAdagrad(t.lr, rowwise=t.adagrad_variant == "rowwise")
        params = [p for p in self.decoder.parameters() if p.numel() > 0]
        self.relation_optimizer = build_relation_optimizer(t.relation_optimizer, params, t.relation_lr) \
            if params else None
        self.device = device

    def state_dict(self) -> dict:
        return {"decoder": self.decoder.state_dict(),
                "relation_optimizer": None if self.relation_optimizer is None
                else self.relation_optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.decoder.load_state_dict(state["decoder"])
        if self.relation_optimizer is not None:
            self.relation_optimizer.load_state_dict(state["relation_optimizer"])

    def _dropout(self, queries: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        rate = self.config.model.dropout
        if rate == 0:
            return queries
        keep = torch.rand(queries.shape, generator=generator, device=queries.device) >= rate
        return queries * keep / (1 - rate)

    def _direction_loss(self, queries, targets, target_ids, candidates, candidate_ids, generator):
        """Per-edge loss of one corruption direction against the chunks' shared candidates."""
        queries = self._dropout(queries, generator)
        positive = self.decoder.compare_pairs(queries, targets)
        num_chunks = candidates.shape[0]
        negative = self.decoder.compare_all(chunk(queries, num_chunks), candidates)
        valid = chunk(target_ids, num_chunks)[:, :, None] != candidate_ids[:, None, :]
        batch = len(queries)
        negative = negative.reshape(-1, negative.shape[-1])[:batch]
        valid = valid.reshape(-1, valid.shape[-1])[:batch]
        return self.loss_fn(positive, negative, valid, self.config.model.margin)

    def compute_batch(self, nodes: torch.Tensor, state: torch.Tensor, edges: torch.Tensor,
                      generator: torch.Generator) -> BatchUpdate:
        """Loss, relation step and node deltas for one batch of (h, r, t) on the compute device."""
        t, m = self.config.training, self.config.model
        heads, relations, tails = edges[:, 0], edges[:, 1], edges[:, 2]
        num_chunks = 1 if t.num_negatives == -1 else min(t.num_chunks, len(edges))
        endpoints = torch.cat([heads, tails])
        tail_negatives = sample_negatives(endpoints, self.num_nodes, num_chunks, t.num_negatives,
                                          t.degree_fraction, generator).to(edges.device)
        head_negatives = sample_negatives(endpoints, self.num_nodes, num_chunks, t.num_negatives,
                                          t.degree_fraction, generator).to(edges.device)
        ids = torch.cat([heads, tails, tail_negatives.reshape(-1), head_negatives.reshape(-1)])
        rows, local = torch.unique(ids, return_inverse=True)
        embeddings = nodes[rows].requires_grad_(True)
        batch = len(edges)
        h_local, t_local = local[:batch], local[batch:2 * batch]
        tn_local, hn_local = local[2 * batch:].split(tail_negatives.numel())
        h, tl = embeddings[h_local], embeddings[t_local]
        rel_fwd = self.decoder.relation_vectors(relations, inverse=False)
        rel_inv = self.decoder.relation_vectors(relations, inverse=True)
        loss = self._direction_loss(self.decoder.operator(h, rel_fwd), tl, tails,
                                    embeddings[tn_local.reshape(tail_negatives.shape)],
                                    tail_negatives, generator)
        loss = loss + self._direction_loss(self.decoder.operator(tl, rel_inv), h, heads,
                                           embeddings[hn_local.reshape(head_negatives.shape)],
                                           head_negatives, generator)
        loss = loss.mean()
        if m.reg_weight > 0 and m.regularizer != "none":
            with_relations = rel_fwd.shape[-1] and self.decoder.regularize_relations
            tensors = [h, tl] + ([rel_fwd, rel_inv] if with_relations else [])
            loss = loss + m.reg_weight * regularization(m.regularizer, tensors,
                                                        self.decoder.complex_valued, batch)
        if self.relation_optimizer is not None:
            self.relation_optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.relation_optimizer is not None:
            self.relation_optimizer.step()
        delta, squared = self.node_optimizer.compute(embeddings.grad, state[rows])
        return BatchUpdate(rows, delta, squared, loss.detach())


def restore_version(version: Path, model: Model, fingerprint: str, device: torch.device
                    ) -> tuple[torch.Tensor, torch.Tensor, TrainingState]:
    """Node tables on ``device``, ``model`` loaded in place, and the version's training state."""
    nodes, state, model_state, training_state = load_version(version, fingerprint)
    model.load_state_dict(model_state)
    return torch.from_numpy(nodes).to(device), torch.from_numpy(state).to(device), training_state


def init_rows(seed: int, init_scale: float, dim: int):
    """Initial embeddings of rows [start, end): normal(0, init_scale), seeded per partition start."""
    def init(start: int, end: int) -> np.ndarray:
        generator = torch.Generator().manual_seed(seed * 7919 + start)
        return (torch.randn(end - start, dim, generator=generator) * init_scale).numpy()
    return init


class Trainer:
    """Trains one run directory; ``train()`` runs the remaining epochs."""

    def __init__(self, config: Config, dataset: Dataset, run_dir: str | Path, progress: bool = True):
        self.config = config
        self.dataset = dataset
        self.run = RunDirectory(run_dir)
        self.progress = progress
        self.device = resolve_device(config.training.device)
        if config.training.num_threads:
            torch.set_num_threads(config.training.num_threads)
        torch.manual_seed(config.training.seed)  # relation initialisation
        self.model = Model(config, dataset.num_nodes, dataset.num_relations, self.device)
        self.fingerprint = config_fingerprint(config, dataset.metadata)
        self.state = TrainingState(config_fingerprint=self.fingerprint)
        if not self.run.has_checkpoint():
            self.run.create(self.config)
            self._save_checkpoint_from_store()
        self.restore(self.run.latest_version())
        # Records of epochs whose checkpoint never committed are replayed, not duplicated.
        self.run.truncate_metrics(self.state.epoch)
        self._known = None

    # ---- checkpoints ----
    def restore(self, version: Path) -> None:
        """Load a checkpoint version's embeddings, optimizer state and position."""
        self.nodes, self.node_state, self.state = restore_version(version, self.model, self.fingerprint,
                                                                  self.device)

    def _save_checkpoint_from_store(self) -> None:
        """Version 0: initial embeddings written to the zarr store, zero optimizer state."""
        c = self.config
        tmp = self.run.begin_version(0)
        state_dim = self.model.node_optimizer.state_dim(c.model.dim)
        EmbeddingStore.create(tmp / NODES, self.dataset.num_nodes, c.model.dim, state_dim,
                              c.storage.num_partitions,
                              init=init_rows(c.training.seed, c.model.init_scale, c.model.dim))
        write_version_state(tmp, self.model.state_dict(), self.state)
        self.run.commit_version(tmp, 0, is_best=False)

    def save_checkpoint(self, is_best: bool = False) -> None:
        tmp = self.run.begin_version(self.state.epoch)
        save_version(tmp, self.nodes, self.node_state, self.config.storage.num_partitions,
                     self.model.state_dict(), self.state)
        self.run.commit_version(tmp, self.state.epoch, is_best)

    # ---- training ----
    def train_epoch(self, epoch: int) -> dict:
        t = self.config.training
        train = self.dataset.train
        cpu_generator = epoch_generator(t.seed, epoch)
        generator = epoch_generator(t.seed, epoch, self.device) if self.device.type != "cpu" else cpu_generator
        order = torch.randperm(len(train), generator=cpu_generator)
        edges = torch.from_numpy(train)[order].to(self.device)
        num_batches = -(-len(train) // t.batch_size)
        total_loss = torch.zeros((), device=self.device)
        started = time.perf_counter()
        bar = tqdm(range(num_batches), desc=f"epoch {epoch}/{t.epochs}", unit="batch",
                   disable=None if self.progress else True, leave=False, dynamic_ncols=True)
        for index in bar:
            batch = edges[index * t.batch_size:(index + 1) * t.batch_size]
            update = self.model.compute_batch(self.nodes, self.node_state, batch, generator)
            SparseAdagrad.apply(self.nodes, self.node_state, update.rows, update.delta, update.squared)
            total_loss += update.loss * len(batch)
            if index % 20 == 0 and self.progress:
                elapsed = time.perf_counter() - started
                bar.set_postfix(loss=f"{update.loss.item():.4f}",
                                edges_per_s=f"{(index + 1) * t.batch_size / max(elapsed, 1e-9):,.0f}")
        bar.close()
        seconds = time.perf_counter() - started
        if not torch.isfinite(total_loss):
            raise MariusInputError(f"training diverged: the loss of epoch {epoch} is not finite",
                                   path=self.run.path / "config.yaml",
                                   expected="a smaller training.lr or model.init_scale")
        return {"event": "epoch", "epoch": epoch, "loss": float(total_loss) / len(train),
                "seconds": seconds, "edges_per_s": len(train) / seconds}

    def evaluate(self, split: str) -> dict:
        if self._known is None and self.config.evaluation.protocol == "filtered":
            self._known = build_known_answers(self.dataset.all_known_edges(), self.dataset.num_relations)
        metrics = evaluate_split(self.model.decoder, self.nodes, self.dataset, split,
                                 self.config.evaluation, self._known, self.config.training.seed)
        return {"event": "eval", "split": split, "epoch": self.state.epoch, **metrics}

    def _validate(self, counts: bool) -> None:
        """Validate and log; when ``counts``, update best and early-stopping state.

        Only validations on the ``evaluation.every`` schedule count, so a run
        split by a resume selects the same best checkpoint as one that was not.
        """
        metrics = self.evaluate("valid")
        self.run.log(metrics)
        self._say(f"epoch {self.state.epoch}: valid MRR {metrics['mrr']:.4f} "
                  f"Hits@10 {metrics['hits@10']:.4f}")
        if not counts:
            return
        if metrics["mrr"] > self.state.best_mrr:
            self.state.best_mrr, self.state.best_epoch = metrics["mrr"], self.state.epoch
            self.state.validations_without_improvement = 0
        else:
            self.state.validations_without_improvement += 1
        patience = self.config.evaluation.early_stopping_patience
        if patience and self.state.validations_without_improvement >= patience:
            self.state.stopped_early = True
            self._say(f"early stopping: no improvement in {patience} validations")

    def train(self) -> TrainingState:
        """Run the epochs left until ``training.epochs``; checkpoint after each."""
        t, e = self.config.training, self.config.evaluation
        # A resumed run may have extended training.epochs: record what actually runs.
        self.run.write_config(self.config)
        if len(self.dataset.train) == 0:
            raise MariusInputError("dataset has no training edges", path=self.dataset.directory)
        while self.state.epoch < t.epochs and not self.state.stopped_early:
            record = self.train_epoch(self.state.epoch + 1)
            self.state.epoch += 1
            self._say(f"epoch {record['epoch']}: loss {record['loss']:.4f}, "
                      f"{record['edges_per_s']:,.0f} edges/s, {record['seconds']:.1f} s")
            previous_best = self.state.best_epoch
            on_schedule = e.every > 0 and self.state.epoch % e.every == 0
            if self.dataset.metadata.num_valid > 0 and (on_schedule or self.state.epoch == t.epochs):
                self._validate(counts=on_schedule)
            self.save_checkpoint(is_best=self.state.best_epoch != previous_best)
            self.run.log(record)  # after the commit: a crash before it replays this epoch
        return self.state

    def load_best(self) -> None:
        """Replace the in-memory state by the best-validation checkpoint, if any."""
        best = self.run.best_version()
        if best is not None:
            self.restore(best)

    def _say(self, text: str) -> None:
        if self.progress:
            tqdm.write(text)
