"""One batch's maths for the autograd step: planning, loss, gradients, and the relation optimizer.

A batch is planned (``StepModel.plan_batch``: negatives and the table rows it
touches) and computed on gathered rows (``StepModel.compute``: loss, relation
step, additive Adagrad deltas; or ``StepModel.gradients`` without updating
anything, for several devices). The fused step (``fused.py``) computes the
same for dot-product decoders with hand-written gradients; tests compare them.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass

import torch
from torch.nn import functional as F

from marius_py.config import Config
from marius_py.errors import MariusInputError
from marius_py.models import LOSSES, REGULARIZERS, Decoder, DotProductComparator, build_decoder
from marius_py.negatives import (NEGATIVE_SAMPLERS, CandidateRows, by_chunk, chunk_row_weights, negatives_from_draws,
                                 takes_out)
from marius_py.registry import import_plugins, where_defined
from marius_py.optim import SparseAdagrad, build_relation_optimizer
from marius_py.step.fused_loss import SCORE_DTYPES, shared_negative_softmax_ce
from marius_py.pipeline.rows import unique_rows_async


@dataclass
class BatchUpdate:
    rows: torch.Tensor      # unique node ids touched by the batch
    delta: torch.Tensor     # additive embedding update for those rows
    squared: torch.Tensor   # additive Adagrad state update (g^2)
    loss: torch.Tensor


class StepModel:
    """Decoder + losses + optimizers: everything but the node embeddings."""

    def __init__(self, config: Config, num_nodes: int, num_relations: int, device: torch.device):
        m, t = config.model, config.training
        self.config = config
        self.num_nodes = num_nodes
        import_plugins(m.plugins)  # (validation imported them; a spawned worker process has not)
        self.decoder: Decoder = build_decoder(m.decoder, num_relations, m.dim, m.init_scale, m.norm).to(device)
        self.loss_fn = LOSSES.get(m.loss, "model.loss")
        self.regularizer = REGULARIZERS.get(m.regularizer, "model.regularizer")
        self.sampler = NEGATIVE_SAMPLERS.get(t.negative_sampler, "training.negative_sampler")
        self._sampler_fills_out = takes_out(self.sampler)
        self.node_optimizer = SparseAdagrad(t.lr, rowwise=t.adagrad_variant == "rowwise")
        params = [p for p in self.decoder.parameters() if p.numel() > 0]
        self.relation_optimizer = build_relation_optimizer(t.relation_optimizer, params, t.relation_lr) \
            if params else None
        self.device = device
        # Dot-product scores with the softmax loss: the fused loss (step/fused_loss.py).
        self._fused_softmax = isinstance(self.decoder, DotProductComparator) and \
            getattr(self.loss_fn, "fused_kernel", None) == "softmax_ce"

    def state_dict(self) -> dict:
        return {"decoder": self.decoder.state_dict(),
                "relation_optimizer": None if self.relation_optimizer is None
                else self.relation_optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        try:
            self.decoder.load_state_dict(state["decoder"])
        except RuntimeError as error:  # (a plug-in registered under the run's name, with other parameters)
            decoder = type(self.decoder)
            raise MariusInputError(f"the checkpoint's decoder parameters do not fit decoder "
                                   f"{self.config.model.decoder!r} as registered now ({where_defined(decoder)}): "
                                   f"{' '.join(str(error).split())}",
                                   expected="the plug-in the run was trained with") from None
        if self.relation_optimizer is not None:
            self.relation_optimizer.load_state_dict(state["relation_optimizer"])

    def _dropout(self, queries: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        if self.config.model.dropout == 0:
            return queries
        return queries * self.dropout_mask(queries.shape, queries, generator)

    def dropout_mask(self, shape, like: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """keep / (1 - rate), keep drawn uniformly per element from ``generator`` (the fused step draws the same)."""
        rate = self.config.model.dropout
        keep = torch.rand(shape, generator=generator, device=like.device) >= rate
        return keep.to(like.dtype) / (1 - rate)

    def negative_draws(self, num_edges: int, candidates: CandidateRows | None, generator: torch.Generator,
                       out: list | None = None) -> list:
        """The random draws of a batch's negatives, tail corruption then head, by the config's sampler
        (``negatives.NEGATIVE_SAMPLERS``); ``out``: where to put them (the draws of an earlier call)."""
        t = self.config.training
        if t.num_negatives == -1:
            return []
        total = self.num_nodes if candidates is None else candidates.total
        args = (2 * num_edges, total, min(t.num_chunks, num_edges), t.num_negatives, t.degree_fraction, generator)
        if self._sampler_fills_out:
            return [self.sampler(*args, out=None if out is None else out[direction]) for direction in range(2)]
        draws = [self.sampler(*args) for _ in range(2)]
        return draws if out is None else [_filled(into, drawn) for into, drawn in zip(out, draws)]

    def plan_batch(self, edges: torch.Tensor, generator: torch.Generator | None,
                   candidates: CandidateRows | None = None, defer_count: bool = False,
                   draws: list | None = None, unique_stream: torch.cuda.Stream | None = None,
                   table_rows: int | None = None) -> DrawnBatch:
        """Negatives and the table rows of one batch of (h, r, t), on the generator's device.

        Node ids index the node table (global ids in memory, buffer-local rows
        out of core); uniform negatives come from ``candidates`` (default: every
        row of an in-memory table of ``num_nodes``). With ``defer_count`` (CUDA),
        ``rows`` is padded and ``unique_count`` says how many are real: see
        ``DrawnBatch.trimmed``. ``draws`` (``negative_draws``, on the edges'
        device) replaces the generator. With ``unique_stream`` (and
        ``defer_count``), the touched rows are found on that CUDA stream: the
        caller makes its stream wait for it before using rows, local or count.
        ``table_rows`` (the length of the table the ids index) below 2^31 lets
        the rows be sorted on 32-bit keys.
        """
        if candidates is None:
            candidates = CandidateRows.contiguous(self.num_nodes)
        if draws is None:
            edges = edges.to(generator.device)
            draws = self.negative_draws(len(edges), candidates, generator)
        heads, tails = edges[:, 0], edges[:, 2]
        endpoints = torch.cat([heads, tails])
        if draws:
            tail_negatives, head_negatives = (negatives_from_draws(d, endpoints, candidates) for d in draws)
        else:  # every candidate, one chunk
            tail_negatives = head_negatives = candidates.all(edges.device)[None, :]
        side = defer_count and unique_stream is not None
        if side:
            unique_stream.wait_stream(torch.cuda.current_stream(edges.device))
        with torch.cuda.stream(unique_stream) if side else contextlib.nullcontext():
            ids = torch.cat([heads, tails, tail_negatives.reshape(-1), head_negatives.reshape(-1)])
            if defer_count:
                rows, local, count = unique_rows_async(ids, below_2_31=table_rows is not None and table_rows < 2**31)
            else:
                (rows, local), count = torch.unique(ids, return_inverse=True), None
        return DrawnBatch(edges, rows, local, tail_negatives, head_negatives, count,
                         candidates_are_rows=not draws and candidates.is_identity)

    def compute(self, plan: "DrawnBatch", embeddings: torch.Tensor, state: torch.Tensor,
                generator: torch.Generator) -> BatchUpdate:
        """Loss, relation step and node deltas of a planned batch on the compute device.

        ``embeddings`` and ``state`` are the table rows ``plan.rows`` (gathered
        by the caller, so a pipeline can gather on the host); ``generator``
        draws dropout.
        """
        grad, relation_grads, loss = self.gradients(plan, embeddings, generator)
        self.step_relations([relation_grads])
        delta, squared = self.node_optimizer.compute(grad, state)
        return BatchUpdate(plan.rows, delta, squared, loss)

    def gradients(self, plan: "DrawnBatch", embeddings: torch.Tensor,
                  generator: torch.Generator) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:
        """(d loss / d embeddings, d loss / d each relation parameter, mean loss); nothing is updated."""
        embeddings = embeddings.detach().requires_grad_(True)
        params = self.relation_parameters()
        for param in params:
            param.grad = None
        loss = self.batch_loss(plan, embeddings, generator)
        loss.backward()
        relation_grads = [torch.zeros_like(p) if p.grad is None else p.grad for p in params]
        return embeddings.grad, relation_grads, loss.detach()

    def step_relations(self, gradients: list[list[torch.Tensor]]) -> None:
        """One relation-optimizer step per gradient list (several devices' batches, in device order)."""
        if self.relation_optimizer is None:
            return
        params = self.relation_parameters()
        for grads in gradients:
            for param, grad in zip(params, grads):
                param.grad = grad
            self.relation_optimizer.step()

    def relation_parameters(self) -> list[torch.nn.Parameter]:
        if self.relation_optimizer is None:
            return []
        return [p for group in self.relation_optimizer.param_groups for p in group["params"]]

    def batch_loss(self, plan: "DrawnBatch", embeddings: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Mean loss of a batch: both corruption directions scored by one batched matmul.

        Tail corruption scores op(h, r) against the tail negatives, head
        corruption op(t, r_inv) against the head negatives; their chunks are
        stacked into one [2C, M, N] block.
        """
        m = self.config.model
        edges, batch = plan.edges, len(plan.edges)
        heads, relations, tails = edges[:, 0], edges[:, 1], edges[:, 2]
        # index_select: its gradient adds with atomics, not serially per repeated row (hub nodes).
        h = torch.index_select(embeddings, 0, plan.local[:batch])
        tl = torch.index_select(embeddings, 0, plan.local[batch:2 * batch])
        rel_fwd = self.decoder.relation_vectors(relations, inverse=False)
        rel_inv = self.decoder.relation_vectors(relations, inverse=True)
        queries = self._dropout(torch.cat([self.decoder.operator(h, rel_fwd), self.decoder.operator(tl, rel_inv)]),
                                generator)
        positive = self.decoder.compare_pairs(queries, torch.cat([tl, h]))
        negative_ids = torch.cat([plan.tail_negatives, plan.head_negatives])
        negatives = torch.index_select(embeddings, 0, plan.local[2 * batch:]).reshape(*negative_ids.shape, -1)
        num_chunks = plan.tail_negatives.shape[0]
        stacked = by_chunk(queries, batch, num_chunks)
        target_ids = by_chunk(torch.cat([tails, heads]), batch, num_chunks)
        if self._fused_softmax:
            loss = shared_negative_softmax_ce(stacked, negatives, by_chunk(positive, batch, num_chunks),
                                              target_ids, negative_ids,
                                              chunk_row_weights(batch, stacked.shape[1], num_chunks, stacked.dtype,
                                                           stacked.device),
                                              SCORE_DTYPES[self.config.training.score_dtype])
        else:
            negative = self.decoder.compare_all(stacked, negatives)
            valid = target_ids[:, :, None] != negative_ids[:, None, :]
            negative, valid = (_per_query(x, batch) for x in (negative, valid))
            loss = self.loss_fn(positive, negative, valid, m.margin).reshape(2, batch).sum(0).mean()
        if m.reg_weight > 0:
            with_relations = rel_fwd.shape[-1] and self.decoder.regularize_relations
            tensors = [h, tl] + ([rel_fwd, rel_inv] if with_relations else [])
            loss = loss + m.reg_weight * self.regularizer(tensors, self.decoder.complex_valued) / batch
        weight = self.config.training.relation_prediction
        if weight > 0:
            loss = loss + weight * self.relation_prediction_loss(h, tl, relations)
        return loss

    def relation_prediction_loss(self, heads: torch.Tensor, tails: torch.Tensor,
                                 relation_ids: torch.Tensor) -> torch.Tensor:
        """Mean over edges of -log P(r | h, t) - log P(r_inv | t, h), softmax over all 2R relation rows.

        The auxiliary objective of Chen et al. (AKBC 2021), in both directions
        as the link objective: each edge's relation is predicted from its
        head and tail against every forward and inverse relation vector.
        """
        table = self.decoder.relations
        logits = torch.cat([self.decoder.relation_features(heads, tails),
                            self.decoder.relation_features(tails, heads)]) @ table.T
        targets = torch.cat([relation_ids, relation_ids + self.decoder.num_relations])
        return F.cross_entropy(logits, targets, reduction="sum") / len(relation_ids)

    def compute_batch(self, nodes: torch.Tensor, state: torch.Tensor, edges: torch.Tensor,
                      generator: torch.Generator, candidates: CandidateRows | None = None) -> BatchUpdate:
        """``plan_batch`` then ``compute`` on rows gathered from ``nodes``/``state`` (one generator)."""
        plan = self.plan_batch(edges, generator, candidates)
        return self.compute(plan, nodes[plan.rows], state[plan.rows], generator)


def _filled(into: tuple, drawn: tuple) -> tuple:
    """A sampler's draws copied into the buffers ``into`` (a CUDA graph reads the same ones every batch)."""
    for buffer, values in zip(into, drawn):
        if buffer is not None:
            buffer.copy_(values)
    return into


def _per_query(block: torch.Tensor, batch: int) -> torch.Tensor:
    """[2C, M, N] chunk rows -> [2 * batch, N] query rows, dropping the chunks' padding."""
    rows = block.reshape(2, -1, block.shape[-1])
    if rows.shape[1] != batch:
        rows = rows[:, :batch]
    return rows.reshape(2 * batch, -1)


@dataclass
class DrawnBatch:
    """What a batch needs besides embeddings: its edges, negatives and the rows they touch."""

    edges: torch.Tensor            # [B, 3] (h, r, t); node ids are table rows
    rows: torch.Tensor             # table rows the batch touches, each once (padded until ``trimmed``)
    local: torch.Tensor            # position in ``rows`` of the heads, tails, tail then head negatives
    tail_negatives: torch.Tensor   # [C, N] table rows
    head_negatives: torch.Tensor   # [C, N]
    unique_count: torch.Tensor | None = None  # [1] on the device: rows beyond it are padding
    # 1-vs-all over every row of the table (``CandidateRows.is_identity``): the rows are 0..N-1 in order, and
    # both directions' candidates are those rows (candidate j is row j).
    candidates_are_rows: bool = False

    def tensors(self) -> list[torch.Tensor]:
        fields = [getattr(self, f.name) for f in dataclasses.fields(self)]
        return [t for t in fields if isinstance(t, torch.Tensor)]

    def trimmed(self, count: int) -> "DrawnBatch":
        """The plan with its padding rows dropped, once ``unique_count`` has been read."""
        return dataclasses.replace(self, rows=self.rows[:count], unique_count=None)

    def routed(self, rows: torch.Tensor, local: torch.Tensor) -> DrawnBatch:
        """The plan with its rows reordered (``local`` follows them), e.g. grouped by owner device."""
        return dataclasses.replace(self, rows=rows, local=local, candidates_are_rows=False)

    def in_row_positions(self) -> DrawnBatch:
        """The plan with node ids replaced by positions in ``rows`` (for rows gathered into their own tensor)."""
        batch, num_chunks = len(self.edges), self.tail_negatives.shape[0]
        local = self.local
        edges = torch.stack([local[:batch], self.edges[:, 1], local[batch:2 * batch]], dim=1)
        negatives = local[2 * batch:].reshape(2, num_chunks, -1)
        return dataclasses.replace(self, edges=edges, tail_negatives=negatives[0], head_negatives=negatives[1])

    def pinned(self) -> "DrawnBatch":
        return self._mapped(lambda t: t.pin_memory())

    def to(self, device: torch.device, non_blocking: bool = False) -> "DrawnBatch":
        return self._mapped(lambda t: t.to(device, non_blocking=non_blocking))

    def _mapped(self, move) -> "DrawnBatch":
        return dataclasses.replace(self, **{f.name: move(getattr(self, f.name)) for f in dataclasses.fields(self)
                                            if isinstance(getattr(self, f.name), torch.Tensor)})
