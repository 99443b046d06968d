"""The config schema's help: every key documented once, briefly, without measurements (they live in the
docs' results, where their dates and commands are)."""

from __future__ import annotations

import dataclasses
import re

import pytest

from marius_py.config import Config, describe_schema

MEASUREMENT = re.compile(r"\d\.\d{3,}|RESULTS|[GM]i?B/s|edges/s|\bmeasured\b")


def helps() -> dict[str, str]:
    return {f"{section.name}.{key.name}": key.metadata["help"] for section in dataclasses.fields(Config)
            for key in dataclasses.fields(section.default_factory())}


@pytest.mark.parametrize("key", sorted(helps()))
def test_each_help_is_at_most_two_sentences_without_measurements(key):
    text = helps()[key]
    assert text.strip() and len(re.split(r"(?<=\.)\s+(?=[A-Z])", text)) <= 2 and len(text) <= 340, text
    assert not MEASUREMENT.search(text), f"{key}: measurements belong in the docs' results: {text}"


def test_help_config_lists_every_key_with_its_default():
    listed = describe_schema()
    for key in helps():
        assert f"\n{key} = " in f"\n{listed}"


def test_the_checks_catch_a_long_help_and_a_measurement():
    assert MEASUREMENT.search("lost 0.0067 on FB15k-237") and MEASUREMENT.search("ran at 2.1 GB/s")
    assert len(re.split(r"(?<=\.)\s+(?=[A-Z])", "One. Two. Three")) == 3


def test_the_docs_configuration_reference_lists_every_key_with_its_help():
    """docs/reference/config.md is generated from the schema: one source for help text."""
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parent.parent / "docs" / "generate.py"
    spec = importlib.util.spec_from_file_location("docs_generate", path)
    generate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generate)
    page = generate.config_reference()
    for key, text in helps().items():
        assert f"**`{key}`**" in page and text.replace("\n", " ") in page, key
