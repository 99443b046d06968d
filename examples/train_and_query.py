"""Train on the bundled CoDEx-M, then query the model by original names.

    python examples/train_and_query.py            # a short run (3 epochs), about a minute on 2 cores
"""

import tempfile

import marius_py as mp

run_dir = tempfile.mkdtemp(prefix="marius-example-")
config = mp.make_config("codex-m", ["training.epochs=3", "evaluation.every=3"])
model = mp.train(config, run_dir=run_dir, progress=True)
print("test MRR", round(model.test_metrics["mrr"], 4), "- run directory", run_dir)

model = mp.load_checkpoint(run_dir)                  # the best-validation checkpoint
dataset = model.dataset
head, relation = dataset.node_names[0], dataset.relation_names[0]
print("embedding of", head, model.embedding(head)[:4], "...")
for name, score in model.predict(head=head, relation=relation, k=5, filter_known=True):
    print(f"({head}, {relation}, ?) -> {name}  {score:.3f}")
h, r, t = dataset.test[0]
triple = (dataset.node_names[h], dataset.relation_names[r], dataset.node_names[t])
print("score of the first test edge", triple, float(model.score([triple])[0]))
