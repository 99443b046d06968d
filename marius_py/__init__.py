"""marius-py: out-of-core graph embeddings for link prediction.

The Python API (see ``marius_py.api``): ``load_dataset``, ``make_config``,
``train``, ``load_checkpoint`` and ``TrainedModel`` (``embedding``, ``score``,
``predict``, ``evaluate``); ``tune`` and ``resume_tune`` search hyperparameters
(``marius_py.search``, with the tune extra).

Research code extends the engine by registering plug-ins by name, which a config then names:
``DECODERS`` (subclasses of ``Decoder``: ``score_hrt`` alone, or an operator and a comparator such as
``DotProductComparator``'s), ``LOSSES``, ``REGULARIZERS``, ``NEGATIVE_SAMPLERS`` and ``ORDERINGS``;
``model.plugins`` names modules that register them, for the command line and for reopening a run.
"""

# First, before torch's import: start-up is timed from the package's import (timeline.Startup).
from marius_py import timeline

IMPORTED_AT = timeline.IMPORTED_AT

from marius_py.api import TrainedModel, load_checkpoint, load_dataset, make_config, train  # noqa: E402
from marius_py.config import ORDERINGS, Config  # noqa: E402
from marius_py.memory_data import Dataset  # noqa: E402
from marius_py.errors import MariusInputError  # noqa: E402
from marius_py.models import DECODERS, LOSSES, REGULARIZERS, Decoder, DotProductComparator  # noqa: E402
from marius_py.negatives import NEGATIVE_SAMPLERS  # noqa: E402
from marius_py.search import resume_tune, tune  # noqa: E402

__all__ = ["Config", "DECODERS", "Dataset", "Decoder", "DotProductComparator", "LOSSES", "MariusInputError",
           "NEGATIVE_SAMPLERS", "ORDERINGS", "REGULARIZERS", "TrainedModel", "load_checkpoint", "load_dataset",
           "make_config", "resume_tune", "train", "tune"]
__version__ = "0.1.0"
