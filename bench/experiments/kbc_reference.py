r"""A plain-PyTorch reference of Chen et al.'s (AKBC 2021) ComplEx-N3 training, to set beside ours.

    python bench/experiments/kbc_reference.py --dataset <dir>/codex-s --seeds 0 1 2 \
        --out bench/results/gpu-kbc-reference-codex-s.json

Written from their paper and public repository (facebookresearch/ssl-relation-prediction, the LCWA
path), not copied: every query (h, r, ?) and reciprocal (t, r + R, ?) is scored against all
entities and its relation against all 2R relations (cross-entropy, means over the batch of queries,
relation loss weighted by --w-rel); N3 on the complex moduli of the query's three rows, lambda x sum
/ queries; torch.optim.Adagrad over both dense tables; N(0, 1) x init initialisation; queries
reshuffled each pass. Every --valid-every epochs (from epoch 0) valid and test are ranked, filtered
against all splits, each direction counting candidates scoring >= the answer (ties pessimistic), MRR
the mean of the two directions; the test MRR at the best validation MRR is the figure their README
reports. It shares no code with marius_py, so a gap between the two is ours or theirs to explain.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch


def read_split(path: Path) -> list[tuple[str, str, str]]:
    with open(path, encoding="utf-8") as f:
        return [tuple(line.rstrip("\n").split("\t")) for line in f if line.strip()]


def load(dataset: Path, device: str) -> tuple[dict[str, torch.Tensor], int, int]:
    raw = {split: read_split(dataset / f"{split}.txt") for split in ("train", "valid", "test")}
    everything = [t for rows in raw.values() for t in rows]
    entities = {e: i for i, e in enumerate(sorted({t[0] for t in everything} | {t[2] for t in everything}))}
    relations = {r: i for i, r in enumerate(sorted({t[1] for t in everything}))}
    ids = {split: torch.tensor([[entities[h], relations[r], entities[t]] for h, r, t in rows], device=device)
           for split, rows in raw.items()}
    return ids, len(entities), len(relations)


def reciprocal(triples: torch.Tensor, num_relations: int) -> torch.Tensor:
    return torch.stack([triples[:, 2], triples[:, 1] + num_relations, triples[:, 0]], dim=1)


class ComplEx(torch.nn.Module):
    def __init__(self, num_entities: int, num_relations: int, rank: int, init: float):
        super().__init__()
        self.rank = rank
        self.entity = torch.nn.Parameter(torch.randn(num_entities, 2 * rank) * init)
        self.relation = torch.nn.Parameter(torch.randn(2 * num_relations, 2 * rank) * init)

    def halves(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x[:, :self.rank], x[:, self.rank:]

    def query(self, queries: torch.Tensor) -> torch.Tensor:
        (h_re, h_im), (r_re, r_im) = self.halves(self.entity[queries[:, 0]]), self.halves(self.relation[queries[:, 1]])
        return torch.cat([h_re * r_re - h_im * r_im, h_re * r_im + h_im * r_re], dim=1)

    def forward(self, queries: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        h, r, t = self.entity[queries[:, 0]], self.relation[queries[:, 1]], self.entity[queries[:, 2]]
        (h_re, h_im), (t_re, t_im) = self.halves(h), self.halves(t)
        entity_scores = self.query(queries) @ self.entity.t()
        relation_scores = torch.cat([h_re * t_re + h_im * t_im, h_re * t_im - h_im * t_re], dim=1) @ self.relation.t()
        n3 = sum((a ** 2 + b ** 2).sqrt().pow(3).sum() for a, b in map(self.halves, (h, r, t)))
        return entity_scores, relation_scores, n3


def known_answers(queries: torch.Tensor, all_queries: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, entity) pairs to filter: every answer of each query's (head, relation) in any split."""
    keys = all_queries[:, 0] * 1_000_000 + all_queries[:, 1]
    order = torch.argsort(keys)
    keys, answers = keys[order], all_queries[order, 2]
    wanted = queries[:, 0] * 1_000_000 + queries[:, 1]
    start, end = torch.searchsorted(keys, wanted), torch.searchsorted(keys, wanted, right=True)
    counts = end - start
    rows = torch.repeat_interleave(torch.arange(len(queries), device=queries.device), counts)
    offsets = torch.arange(int(counts.sum()), device=queries.device) - torch.repeat_interleave(
        torch.cumsum(counts, 0) - counts, counts)
    return rows, answers[torch.repeat_interleave(start, counts) + offsets]


@torch.no_grad()
def mrr(model: ComplEx, triples: torch.Tensor, all_queries: torch.Tensor, num_relations: int) -> float:
    directions = []
    for queries in (triples, reciprocal(triples, num_relations)):
        q = model.query(queries)
        scores = q @ model.entity.t()
        target = (q * model.entity[queries[:, 2]]).sum(1, keepdim=True)
        rows, cols = known_answers(queries, all_queries)
        scores[rows, cols] = -1e6
        ranks = 1 + (scores >= target).sum(1)
        directions.append((1.0 / ranks.float()).mean().item())
    return sum(directions) / 2


def train(args: argparse.Namespace, seed: int) -> dict:
    torch.manual_seed(seed)
    ids, num_entities, num_relations = load(Path(args.dataset), args.device)
    train_queries = torch.cat([ids["train"], reciprocal(ids["train"], num_relations)])
    all_queries = torch.cat([torch.cat([t, reciprocal(t, num_relations)]) for t in ids.values()])
    model = ComplEx(num_entities, num_relations, args.rank, args.init).to(args.device)
    optimizer = torch.optim.Adagrad(model.parameters(), lr=args.lr)
    ce = torch.nn.CrossEntropyLoss()
    best, history, started = {"valid": -1.0}, [], time.perf_counter()
    order, cursor = torch.randperm(len(train_queries), device=args.device), 0
    for epoch in range(args.epochs):
        # Their sampler: an epoch's loop ends after the batch that starts the next shuffle.
        reshuffled = False
        while not reshuffled:
            if cursor >= len(order):
                order, cursor, reshuffled = torch.randperm(len(train_queries), device=args.device), 0, True
            batch = train_queries[order[cursor:cursor + args.batch_size]]
            cursor += args.batch_size
            entity_scores, relation_scores, n3 = model(batch)
            loss = (ce(entity_scores, batch[:, 2]) + args.w_rel * ce(relation_scores, batch[:, 1])
                    + args.lmbda * n3 / len(batch))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if epoch % args.valid_every == 0:
            point = {"epoch": epoch, "valid": mrr(model, ids["valid"], all_queries, num_relations),
                     "test": mrr(model, ids["test"], all_queries, num_relations)}
            history.append(point)
            if point["valid"] > best["valid"]:
                best = point
    return {"seed": seed, "best_valid_epoch": best["epoch"], "valid_mrr": best["valid"],
            "test_mrr_at_best_valid": best["test"],
            "final_test_mrr": mrr(model, ids["test"], all_queries, num_relations),
            "seconds": time.perf_counter() - started, "history": history}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", required=True, help="folder with raw train/valid/test.txt")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--rank", type=int, default=1000, help="complex rank (real dimension 2 x rank)")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--batch-size", type=int, default=1000, help="queries (an edge gives two)")
    parser.add_argument("--lmbda", type=float, default=0.01, help="N3 weight")
    parser.add_argument("--w-rel", type=float, default=0.125, help="relation prediction weight")
    parser.add_argument("--init", type=float, default=1e-3)
    parser.add_argument("--epochs", type=int, default=500)
    parser.add_argument("--valid-every", type=int, default=3)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", default="bench/results/kbc-reference.json")
    args = parser.parse_args()
    runs = []
    print(f"{'seed':>4} {'best valid epoch':>16} {'valid MRR':>9} {'test MRR':>9} {'final test':>10} {'seconds':>8}")
    for seed in args.seeds:
        run = train(args, seed)
        runs.append(run)
        print(f"{seed:>4} {run['best_valid_epoch']:>16} {run['valid_mrr']:>9.4f} {run['test_mrr_at_best_valid']:>9.4f} "
              f"{run['final_test_mrr']:>10.4f} {run['seconds']:>8.1f}", flush=True)
    tests = torch.tensor([r["test_mrr_at_best_valid"] for r in runs])
    if len(runs) > 1:
        print(f"test MRR at best valid: mean {tests.mean():.4f} sd {tests.std():.4f}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    device = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "cpu"
    Path(args.out).write_text(json.dumps({"machine": device, "args": vars(args), "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
