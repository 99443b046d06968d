"""The training step of Dot, DistMult, ComplEx, TransE and RotatE with softmax cross-entropy, by hand-written
gradients (``fused_step_refusal`` says which configs it covers: plug-ins declare what it can compute).

For these decoders every gradient is a closed form in the rows the step
already reads, so a batch needs a handful of kernels where autograd launches
~90 and makes ~20 passes over [batch, d] tensors (per-edge maths:
``edge_kernels.py``; distance score blocks: ``fused_loss.ScoreForm``):

1. ``edge_queries``: per edge, the queries op(h, r_fwd) and op(t, r_inv) (in
   the score dtype, with the query dropout applied), the positive scores and
   the N3/L2 regulariser, read straight from the node table.
2. The candidates' rows, and ``softmax_ce_gradients`` (``fused_loss.py``):
   the loss and the gradients of queries, candidates and positive scores.
3. ``edge_backward_``: per edge, the gradients of h, t and both relation
   vectors (the regulariser's included), added (atomically) into a gradient per
   touched row and per relation.
4. With ``training.relation_prediction``, ``relation_prediction_``: the
   softmax over relation vectors and its gradients (torch operations).
5. ``sparse_adagrad_``: Adagrad on the touched rows, in place in the tables.

It computes what ``StepModel.compute`` + ``SparseAdagrad.apply`` compute (tests
compare them), in place in GPU memory or pinned host tables; several devices
use its gradients alone (``gradients``). The per-edge and row functions have
Triton kernels for float32 CUDA tables (RotatE's per-edge part excepted: torch
operations) and torch versions (CPU, float64) that the tests use as reference.
"""

from __future__ import annotations

import contextlib

import torch

from marius_py.models import DECODERS, LOSSES, REGULARIZERS
from marius_py.step.edge_kernels import EdgeMaths, edge_backward_, edge_queries, relation_prediction_
from marius_py.step.fused_loss import (SCORE_DTYPES, candidate_padding, pad_candidate_ids, score_form,
                                      softmax_ce_gradients, to_16_bytes)
from marius_py.negatives import by_chunk, chunk_row_weights
from marius_py.optim import RelationAdagrad
from marius_py.pipeline.row_kernels import gather_rows, scatter_add_rows_, sparse_adagrad_
from marius_py.pipeline.step import rounding_seed


def supports_fused_step(model) -> bool:
    """Whether ``FusedStep`` computes this model's step (``fused_step_refusal``)."""
    return fused_step_refusal(model.config) is None


def fused_step_refusal(config) -> str | None:
    """Why the fused step cannot compute this config's step, or None where it can: it has kernels for the
    decoders that declare an ``edge_operator`` (Dot, DistMult, ComplEx, TransE, RotatE), the loss and the
    regularisers that declare a ``fused_kernel`` (softmax_ce; none, n3, l2). Any other plug-in trains on the
    autograd step (``model.StepModel``), on every placement."""
    m = config.model
    decoder = DECODERS.get(m.decoder, "model.decoder")
    if decoder.edge_operator is None:
        return f"decoder {m.decoder} has no fused kernel (no edge_operator)"
    if getattr(LOSSES.get(m.loss, "model.loss"), "fused_kernel", None) != "softmax_ce":
        return f"loss {m.loss} has no fused kernel (softmax_ce has)"
    regularizer = REGULARIZERS.get(m.regularizer, "model.regularizer")
    if m.reg_weight > 0 and getattr(regularizer, "fused_kernel", None) != m.regularizer:
        return f"regulariser {m.regularizer} has no fused kernel (none, n3 and l2 have)"
    return None


class FusedStep:
    """One batch of a ``StepModel`` (see ``supports_fused_step``) applied in place to its tables."""

    def __init__(self, model):
        self.model = model
        self.maths = EdgeMaths.of(model)
        m = model.config.model
        self.reg_weight = m.reg_weight if self.maths.regularizer != "none" else 0.0
        self.dropout = m.dropout
        self.relation_prediction = model.config.training.relation_prediction
        # Distance blocks stay float32: the L2 expansion cancels in bfloat16, the pairwise kernels gain nothing.
        self.score_dtype = SCORE_DTYPES[model.config.training.score_dtype] if self.maths.comparator == "dot" \
            else torch.float32
        self.score_form = score_form(self.maths.comparator, model.config.model.dim)
        self.adagrad = model.node_optimizer
        self.relations = model.decoder.relations if model.decoder.relations.numel() else None
        optimizer = model.relation_optimizer
        group = optimizer.param_groups[0] if optimizer is not None else {}
        # Plain Adagrad on the relations is stepped here with tensor ops only (no host reads: capturable).
        self.own_relation_step = self.relations is None or (
            type(optimizer) is RelationAdagrad and group["lr_decay"] == 0 and group["weight_decay"] == 0
            and not group["maximize"] and group["initial_accumulator_value"] == 0)

    def run(self, plan, nodes: torch.Tensor, state: torch.Tensor, loss_sum: torch.Tensor,
            generator: torch.Generator | None = None) -> None:
        """Train one planned batch (``StepModel.plan_batch``): update ``nodes``, ``state`` and relations.

        ``generator`` draws the dropout mask (as ``StepModel.compute`` does)."""
        self.apply(plan, nodes, state, loss_sum, generator=generator)
        self.count_relation_step()

    def relation_tensors(self) -> list[torch.Tensor]:
        """The relation parameters and their Adagrad sums (tensors a captured step reads)."""
        if self.relations is None:
            return []
        state = self.model.relation_optimizer.state.get(self.relations, {})
        return [self.relations] + ([state["sum"]] if "sum" in state else [])

    def count_relation_step(self) -> None:
        """Advance the relation optimizer's step count (host-side, so kept out of ``apply``)."""
        if self.relations is not None and self.own_relation_step:
            self.model.relation_optimizer.state[self.relations]["step"] += 1

    def apply(self, plan, nodes: torch.Tensor, state: torch.Tensor, loss_sum: torch.Tensor,
              gathered: torch.Tensor | None = None, unique_stream: torch.cuda.Stream | None = None,
              generator: torch.Generator | None = None) -> None:
        """``run`` without the step count: device work only when ``own_relation_step`` (a CUDA graph captures it).

        ``gathered``: the embeddings of ``plan.rows`` already on the device
        (tables in pinned host memory); the step then reads rows from it and
        writes the update into the tables through ``plan.rows``. ``unique_stream``:
        the stream still computing the plan's rows (``StepModel.plan_batch``); the
        scores are computed meanwhile, as they need only the edges and negatives.
        """
        grad_rows, grad_relations, loss = self.gradients(plan, nodes if gathered is None else gathered,
                                                         in_place=gathered is None, unique_stream=unique_stream,
                                                         generator=generator)
        with _on_stream(unique_stream, fork=True):  # beside the node update
            if grad_relations is not None:
                self._step_relations(grad_relations)
            loss_sum.add_(loss * len(plan.edges))
        count = plan.unique_count if plan.unique_count is not None else len(plan.rows)
        sparse_adagrad_(nodes, state, plan.rows, grad_rows, count, self.adagrad.lr, self.adagrad.eps,
                        seed=rounding_seed(nodes, generator))
        _join(unique_stream)

    def gradients(self, plan, source: torch.Tensor, in_place: bool = False,
                  unique_stream: torch.cuda.Stream | None = None, generator: torch.Generator | None = None):
        """(d loss / d rows [len(plan.rows), d], d loss / d relations or None, mean loss) of a planned batch.

        Rows past the plan's real ones (``unique_count``) are padding: zero,
        or unset where 1-vs-all shares its candidate block. ``source``: the
        node table (``in_place``: plan ids index it) or the rows ``plan.rows``
        gathered into their own tensor. ``generator`` draws the dropout mask
        (needed when the model has dropout).
        """
        ids = plan if in_place else plan.in_row_positions()
        dim, batch = source.shape[1], len(plan.edges)
        shared = self._shares_candidates(plan)
        # Zeroed beside the score block (shared candidates write every real row instead). Made on the side
        # stream, used on this one: safe without record_stream because the side stream's next allocation
        # follows its wait on this stream.
        with _on_stream(unique_stream):
            grad_rows = (torch.empty if shared else torch.zeros)(len(plan.rows), dim, dtype=source.dtype,
                                                                 device=source.device)
        score_dtype = torch.float64 if source.dtype == torch.float64 else self.score_dtype
        relations = None if self.relations is None else self.relations.detach()
        mask = self.dropout_mask(2 * batch, dim, source, generator)
        loss, grad_queries, grad_candidates, grad_positive, head_offset = self._score_block(
            source, relations, ids, score_dtype, mask, shared)

        _join(unique_stream)  # from here on the plan's rows are needed
        if shared:  # candidate j is row j: its gradient is the row's first
            num_rows = ids.tail_negatives.shape[1]
            grad_rows[:num_rows].copy_(grad_candidates[0, :num_rows, :dim])
            # Where endpoints that are not candidates would sit (none: every endpoint is a row of the table).
            grad_rows[num_rows:num_rows + 2 * batch].zero_()
        else:
            self._add_candidate_gradients(grad_rows, plan.local[2 * batch:], grad_candidates)
        grad_relations = None if relations is None else torch.zeros_like(relations)
        edge_backward_(grad_rows, grad_relations, source, relations, ids.edges, plan.local,
                       grad_queries.reshape(-1, grad_queries.shape[-1]), grad_positive.reshape(-1), head_offset,
                       self.maths, mask, self.reg_weight / batch)
        if self.relation_prediction > 0:
            loss = loss + relation_prediction_(grad_rows, grad_relations, source, relations, ids.edges, plan.local,
                                               self.maths, self.relation_prediction,
                                               self.model.decoder.relation_features)
        return grad_rows, grad_relations, loss

    def _shares_candidates(self, plan) -> bool:
        """1-vs-all over every row with a matmul score form: both directions score one [N, d] block of
        candidates (one gather, one matmul for the candidates' gradient, written straight into the rows')."""
        return plan.candidates_are_rows and self.score_form.matmul

    @staticmethod
    def _add_candidate_gradients(grad_rows: torch.Tensor, positions: torch.Tensor, grad_candidates: torch.Tensor):
        """Scatter-add [G, N', w] candidate gradients to their rows (``positions``: [G x N]); padding
        candidates (N' > N, ``fused_loss.candidate_padding``) have zero gradients, added to row 0."""
        groups, columns = grad_candidates.shape[:2]
        if columns * groups != len(positions):
            positions = pad_candidate_ids(positions.view(groups, -1), columns - len(positions) // groups,
                                          value=0).reshape(-1)
        scatter_add_rows_(grad_rows, positions, grad_candidates.reshape(-1, grad_candidates.shape[-1]))

    def dropout_mask(self, rows: int, dim: int, like: torch.Tensor, generator: torch.Generator | None):
        """The [2B, d] queries' dropout mask, drawn as the autograd step draws it; None without dropout."""
        if self.dropout == 0:
            return None
        if generator is None:
            raise ValueError("the model has dropout: the fused step needs its generator")
        return self.model.dropout_mask((rows, dim), like, generator)

    def relation_gradients(self, gradients) -> list[torch.Tensor]:
        """The relation gradients of ``gradients()``'s result as a list (empty without relations)."""
        return [] if gradients is None else [gradients]

    def step_relations(self, gradients: list[list[torch.Tensor]]) -> None:
        """Step the relations once per gradient list (several devices' batches, in device order)."""
        for grads in gradients:
            for grad in grads:
                self.apply_relation_gradient(grad)
                self.count_relation_step()

    def apply_relation_gradient(self, grad: torch.Tensor) -> None:
        """The relation optimizer's step with this gradient, without the host-side step count."""
        self._step_relations(grad)

    def _score_block(self, source: torch.Tensor, relations: torch.Tensor | None, ids, score_dtype: torch.dtype,
                     mask: torch.Tensor | None, shared: bool = False):
        """(loss, d/d queries, d/d candidates, d/d positive scores, row of the first head-corruption query).

        ``ids``: a plan whose node ids index ``source``. The query and
        candidate rows are padded to 16 bytes for the matmuls. The loss includes
        the regulariser's. ``shared``: one block of candidates for both
        directions, and d/d candidates summed over them ([1, N', w]).
        """
        edges, batch, dim = ids.edges, len(ids.edges), source.shape[1]
        num_chunks, num_candidates = ids.tail_negatives.shape
        width = _aligned_width(dim, score_dtype)
        queries, positive, reg = edge_queries(source, relations, edges, score_dtype, width, self.maths, mask)
        candidate_ids = ids.tail_negatives if shared else torch.cat([ids.tail_negatives, ids.head_negatives])
        pad = candidate_padding(num_candidates, score_dtype, source.device, self.score_form)
        if pad:  # gathered padded (row 0 stands in), rather than copied into a padded block
            candidate_ids = pad_candidate_ids(candidate_ids, pad)
        candidates = gather_rows(source, (candidate_ids.clamp(min=0) if pad else candidate_ids).reshape(-1),
                                 torch.empty(candidate_ids.numel(), width, dtype=score_dtype, device=source.device))
        stacked = by_chunk(queries, batch, num_chunks)
        weights = chunk_row_weights(batch, stacked.shape[1], num_chunks, positive.dtype, positive.device)
        self.constants_used = weights  # cached outside any graph: a graph that captured it keeps it alive
        loss, *gradients = softmax_ce_gradients(
            stacked, candidates.reshape(-1, num_candidates + pad, width),
            by_chunk(positive, batch, num_chunks), by_chunk(torch.cat([edges[:, 2], edges[:, 0]]), batch, num_chunks),
            candidate_ids.expand(2 * num_chunks, -1), weights, score_dtype, self.score_form)
        if reg is not None:
            loss = loss + self.reg_weight * reg.sum().to(loss.dtype) / batch
        return (loss, *gradients, stacked.shape[1] * num_chunks)

    def _step_relations(self, grad: torch.Tensor) -> None:
        optimizer = self.model.relation_optimizer
        if not self.own_relation_step:
            self.relations.grad = grad
            optimizer.step()
            self.relations.grad = None
            return
        group, accumulated = optimizer.param_groups[0], optimizer.state[self.relations]["sum"]
        accumulated.addcmul_(grad, grad)  # RelationAdagrad's arithmetic
        self.relations.data.addcdiv_(grad, accumulated.sqrt().add_(group["eps"]), value=-group["lr"])


class FusedGradients:
    """A model's planning with the fused step's gradients: one device's step among several."""

    def __init__(self, model, fused: FusedStep):
        self.model, self.fused = model, fused

    def negative_draws(self, *args, **kwargs):
        return self.model.negative_draws(*args, **kwargs)

    def plan_batch(self, *args, **kwargs):
        return self.model.plan_batch(*args, **kwargs)

    def gradients(self, plan, embeddings: torch.Tensor, generator: torch.Generator):
        grad, relation_grad, loss = self.fused.gradients(plan, embeddings, generator=generator)
        return grad, self.fused.relation_gradients(relation_grad), loss

    def step_relations(self, gradients: list[list[torch.Tensor]]) -> None:
        self.fused.step_relations(gradients)

    @property
    def graphable(self) -> bool:
        """Whether the step is device work only (a CUDA graph can hold it): no dropout draw, own relation step."""
        return self.fused.own_relation_step and self.fused.dropout == 0

    def apply_relation_gradients(self, gradients: list[list[torch.Tensor]]) -> None:
        """``step_relations`` without the host-side step count (``count_relation_step``)."""
        for grads in gradients:
            for grad in grads:
                self.fused.apply_relation_gradient(grad)

    def count_relation_step(self) -> None:
        self.fused.count_relation_step()

    def relation_tensors(self) -> list[torch.Tensor]:
        return self.fused.relation_tensors()


def gradient_step(model):
    """What several devices run per batch: the fused step's gradients where the model has them (and the
    config asks for it), else the model's autograd gradients."""
    if model.config.training.fused_step and supports_fused_step(model):
        return FusedGradients(model, FusedStep(model))
    return model


def _on_stream(stream: torch.cuda.Stream | None, fork: bool = False):
    """Run the block on ``stream`` (after the current stream's work so far when ``fork``); None: in place."""
    if stream is None:
        return contextlib.nullcontext()
    if fork:
        stream.wait_stream(torch.cuda.current_stream(stream.device))
    return torch.cuda.stream(stream)


def _join(stream: torch.cuda.Stream | None) -> None:
    """Make the current stream wait for ``stream``'s work so far (None: nothing to wait for)."""
    if stream is not None:
        torch.cuda.current_stream(stream.device).wait_stream(stream)


def _aligned_width(dim: int, dtype: torch.dtype) -> int:
    """d rounded up to whole 16-byte rows: cuBLAS picks its fastest kernels only for aligned rows."""
    return dim + to_16_bytes(dim, dtype)
