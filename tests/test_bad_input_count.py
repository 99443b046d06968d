"""The bad-input corpus spans several files, one per family; together they hold at least 100 cases
(issue 36), and issue 51's families at least 60 more, so a file that loses its table, or cases, fails here."""

from __future__ import annotations

import importlib

CORPUS_MODULES = {  # module -> the families it covers
    "test_bad_input_corpus": "configs, overrides, CLI arguments, edge files, run directories",
    "test_preprocess_bad_input": "edge files and preprocess options",
    "test_bad_input_files": "input files (encodings, line endings, delimiters, quoting, whitespace, NUL, "
                            "empty, huge ids) and configs (types, nesting, duplicates, non-finite numbers)",
    "test_bad_input_runs": "run directories (missing, corrupt, foreign, locked, read-only; two commands at "
                           "once), resume with changed settings or partial state, API misuse",
    "test_bad_input_commands": "eval, export and predict arguments",
    # issue 51's families
    "test_bad_input_identity": "datasets changed under a run (renumbered, names edited, edges changed, damaged files, "
                               "raw files replaced), resumes naming the settings that differ",
    "test_bad_input_disk": "a full disk in every command that writes",
    "test_bad_input_messages": "interrupts, pipes and special files, hints that match the cause, validation first",
    "test_bad_input_bounds": "bounds of keys that reach the OS or the allocator, API argument types, values "
                             "that cannot be honoured",
}
ISSUE_51_MODULES = ("test_bad_input_identity", "test_bad_input_disk", "test_bad_input_messages",
                    "test_bad_input_bounds")


def test_corpus_holds_at_least_a_hundred_cases():
    counts = {name: len(importlib.import_module(name).CASES) for name in CORPUS_MODULES}
    assert all(count >= 10 for count in counts.values()), counts
    assert sum(counts.values()) >= 310, counts  # (250 before issue 51, which asked for 60 more)
    assert sum(counts[name] for name in ISSUE_51_MODULES) >= 60, counts
