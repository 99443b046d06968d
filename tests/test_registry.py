"""The registry mechanism every extension point uses: register by name (a decorator or a call), refuse a
name twice and an unfit plug-in, and name the registered ones for an unknown name."""

from __future__ import annotations

import pytest

from marius_py.errors import MariusInputError
from marius_py.registry import Registry, check_function


def test_register_by_decorator_or_call_and_resolve():
    things = Registry("thing", "my.THINGS")

    @things.register("a")
    def a():
        return 1

    things.register("b", len)
    assert things.get("a") is a and things.get("b") is len
    assert things.names() == ("a", "b") and "a" in things and len(things) == 2
    assert things.register("a", a) is a  # (the same plug-in again: nothing to refuse)


def test_a_name_twice_is_refused_unless_replaced():
    things = Registry("thing", "my.THINGS")
    things.register("a", len)
    with pytest.raises(MariusInputError, match="thing 'a' is already registered"):
        things.register("a", sum)
    things.register("a", sum, replace=True)
    assert things.get("a") is sum


def test_an_unknown_name_lists_the_registered_ones():
    things = Registry("thing", "my.THINGS")
    things.register("a", len)
    with pytest.raises(MariusInputError, match=r"model.thing: unknown thing 'z' \(expected one of a; a plug-in is "
                                               r"registered with my.THINGS.register"):
        things.get("z", "model.thing")


def test_an_unfit_plugin_or_name_is_refused():
    def check(name, plugin):
        if not callable(plugin):
            raise MariusInputError(f"thing {name!r} is not callable")
    things = Registry("thing", "my.THINGS", check=check)
    with pytest.raises(MariusInputError, match="not callable"):
        things.register("x", 3)
    with pytest.raises(MariusInputError, match="thing name ' x'"):
        things.register(" x", len)
    assert "x" not in things


def test_a_registration_for_a_block_only_and_where_each_came_from():
    things = Registry("thing", "my.THINGS", entries={"builtin": len}, loaded_by="model.plugins")
    with things.registered("temporary", sum):
        assert things.get("temporary") is sum and things.origin("temporary") == "builtins"
    assert "temporary" not in things and things.origin("builtin") == "the engine"
    assert things.choices().endswith("or by a module the config names in model.plugins")


def test_a_function_plugin_is_probed_when_it_registers():
    def check(name, plugin):
        check_function("thing", name, plugin, ("a", "b"), (2, 3), lambda out: out == 5, "a + b")
    things = Registry("thing", "my.THINGS", check=check)
    things.register("add", lambda a, b: a + b)
    with pytest.raises(MariusInputError, match=r"thing 'one' \(.*<lambda>\) does not take \(a, b\)"):
        things.register("one", lambda a: a)
    with pytest.raises(MariusInputError, match=r"thing 'mul' .* returned int 6 on a small probe \(expected a \+ b\)"):
        things.register("mul", lambda a, b: a * b)
    assert things.names() == ("add",)
