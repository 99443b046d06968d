"""What the pipeline calls: the training step, handed over by ``marius_py`` as objects.

The pipeline moves batches, rows and updates; what a batch computes (negatives,
scores, gradients, the relation optimizer) belongs to ``marius_py`` and reaches
the pipeline through these interfaces (``marius_py.step.runners`` builds them). A plan
is the step's own object; the pipeline reads only ``edges``, ``rows``,
``local``, ``unique_count`` and the methods ``to``, ``pinned``, ``trimmed``,
``tensors``, ``in_row_positions`` and ``routed``.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch


class PipelineSettings(Protocol):
    staleness_bound: int   # 0: the placement's default
    load_threads: int
    queue_size: int


class BatchStep(Protocol):
    """One batch's maths on one device (``marius_py.step.model.StepModel``)."""

    def negative_draws(self, num_edges: int, candidates, generator: torch.Generator, out: list | None = None) -> list:
        """The random draws of a batch's negatives."""

    def plan_batch(self, edges: torch.Tensor, generator: torch.Generator | None, candidates=None,
                   defer_count: bool = False, draws: list | None = None, unique_stream=None,
                   table_rows: int | None = None) -> Any:
        """Negatives and the table rows the batch touches (each once)."""

    def compute(self, plan, embeddings: torch.Tensor, state: torch.Tensor, generator: torch.Generator) -> Any:
        """Loss, relation step and additive node update (``.delta``, ``.squared``, ``.loss``) of gathered rows."""

    def gradients(self, plan, embeddings: torch.Tensor, generator: torch.Generator
                  ) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:
        """(d loss / d rows, relation gradients, mean loss) of gathered rows; nothing is updated."""

    def step_relations(self, gradients: list[list[torch.Tensor]]) -> None:
        """Step the relation parameters once per gradient list, in order."""


class FusedBatchStep(Protocol):
    """A step that updates the node tables in place (``marius_py.step.fused.FusedStep``)."""

    def run(self, plan, nodes: torch.Tensor, state: torch.Tensor, loss_sum: torch.Tensor,
            generator: torch.Generator | None = None) -> None: ...

    def apply(self, plan, nodes: torch.Tensor, state: torch.Tensor, loss_sum: torch.Tensor,
              gathered: torch.Tensor | None = None, unique_stream=None,
              generator: torch.Generator | None = None) -> None: ...

    def count_relation_step(self) -> None: ...


class GraphedBatchStep(Protocol):
    """A fused step replayed as a CUDA graph (``marius_py.step.graph.GraphedFusedStep``)."""

    def run(self, batch: torch.Tensor, nodes: torch.Tensor, state: torch.Tensor, candidates,
            sampling: torch.Generator) -> bool:
        """Train ``batch``; False (nothing done) where the graph does not apply."""

    def add_loss_to(self, loss_sum: torch.Tensor) -> None: ...


def add_rows_(embeddings: torch.Tensor, state: torch.Tensor, rows: torch.Tensor, delta: torch.Tensor,
              squared: torch.Tensor, seed: int | torch.Tensor | None = None) -> None:
    """The update stage: add an additive update (delta, g^2) to the stored rows, in place.

    Additions commute, so updates that overlap in an asynchronous pipeline are never lost
    (the pipeline's one update thread applies them in turn). ``rows``: 1-D int64 on the tables'
    device, ``delta`` and ``squared`` one row each. A bfloat16 table (``rows`` unique) adds in
    float32 and stores the sum rounded stochastically from ``seed`` (required then): rounding to
    nearest would drop small updates for good.
    """
    from marius_py.storage.rounding import round_stochastic_bfloat16  # local: this interface module imports torch alone
    if seed is None and torch.bfloat16 in (embeddings.dtype, state.dtype):
        raise ValueError("add_rows_: bfloat16 tables need a seed for their stochastic rounding")
    for salt, (table, update) in enumerate(((embeddings, delta), (state, squared))):  # a salt per table
        if table.dtype == torch.bfloat16:
            # (index_select and index_copy_: a CPU's advanced indexing gathers and scatters rows several times
            # slower)
            table.index_copy_(0, rows, round_stochastic_bfloat16(table.index_select(0, rows).float()
                                                                 + update.float(), seed, salt))
        else:
            table.index_add_(0, rows, update)


def widened(rows: torch.Tensor) -> torch.Tensor:
    """Rows of a bfloat16 table (``storage.dtype``) in float32, where training and evaluation compute; rows
    of other tables as stored."""
    return rows.float() if rows.dtype == torch.bfloat16 else rows


def rounding_seed(table: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor | None:
    """The seed of one update's stochastic rounding into a bfloat16 table (None for float32 tables).

    Drawn from the epoch's dropout stream, on its device (no host sync), in batch
    order: a run resumed from a checkpoint, which restores that stream, rounds as
    the uninterrupted run does.
    """
    if table.dtype == torch.float32:
        return None
    if generator is None:
        raise ValueError("rounding_seed: a bfloat16 table's update needs the epoch's generator")
    return torch.randint(1 << 62, (1,), generator=generator, device=generator.device)
