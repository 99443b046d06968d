"""marius-py: out-of-core graph embeddings for link prediction.

The Python API (see ``marius_py.api``): ``load_dataset``, ``make_config``,
``train``, ``load_checkpoint`` and ``TrainedModel`` (``embedding``, ``score``,
``predict``, ``evaluate``).
"""

from marius_py.api import TrainedModel, load_checkpoint, load_dataset, make_config, train
from marius_py.config import Config
from marius_py.dataset import Dataset
from marius_py.errors import MariusInputError

__all__ = ["Config", "Dataset", "MariusInputError", "TrainedModel", "load_checkpoint", "load_dataset",
           "make_config", "train"]
__version__ = "0.1.0"
