"""Sphinx configuration: MyST markdown pages, the furo theme, and reference pages generated from the code.

    python -m sphinx -W -b html docs docs/_build/html

The configuration and CLI references (``reference/config.md``, ``reference/cli.md``) and the results page
(``results.md``) are written by ``generate.py`` before every build, from the config schema, the argument
parser and ``bench/results``: the help text has one source, the code.
"""

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS))
sys.path.insert(0, str(DOCS.parent))

import importlib.util  # noqa: E402

if importlib.util.find_spec("marius_py.orderings") is None:  # (a source checkout without an install)
    raise SystemExit("docs: install the package first: pip install -e '.[docs]'")

import generate  # noqa: E402

project = "marius-py"
author = "the marius-py developers"
extensions = ["myst_parser", "sphinx.ext.autodoc"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
html_theme = "furo"
html_title = "marius-py"
myst_heading_anchors = 3
autodoc_member_order = "bysource"

generate.write_all(DOCS)
