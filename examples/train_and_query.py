"""Train on the bundled CoDEx-M, then query the model by original names.

    python examples/train_and_query.py            # a short run (3 epochs)
"""

import marius_py as mp

config = mp.make_config("codex-m", ["training.epochs=3", "evaluation.every=3"])
model = mp.train(config, run_dir="runs/example", progress=True)
print("test MRR", round(model.test_metrics["mrr"], 4))

model = mp.load_checkpoint("runs/example")          # the best-validation checkpoint
dataset = model.dataset
head, relation = dataset.node_names[0], dataset.relation_names[0]
print("embedding of", head, model.embedding(head)[:4], "...")
for name, score in model.predict(head=head, relation=relation, k=5, filter_known=True):
    print(f"({head}, {relation}, ?) -> {name}  {score:.3f}")
print("score of the first test edge:",
      model.score([tuple(n for n in (dataset.node_names[h], dataset.relation_names[r], dataset.node_names[t]))
                   for h, r, t in dataset.test[:1]]))
