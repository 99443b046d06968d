"""``python -m marius_py`` (and ``torchrun -m marius_py``): the ``marius-py`` command line."""

from marius_py.cli import main

raise SystemExit(main())
