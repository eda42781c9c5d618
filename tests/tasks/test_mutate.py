"""libcst mutation operators: each makes exactly the intended one-site change, deterministically."""

from __future__ import annotations

import difflib

import pytest

from lumotree.tasks.synth.mutate import OPERATORS, mutate, mutation_sites

SOURCE = """LIMIT = 3


def f(a, b, items):
    if a < b and a is not None:
        a += 1
        return a - b
    elif not b:
        return True
    items.append(a)
    print(a in items)
    return (a + 2) * b


class K:
    SIZE = 10

    def g(self, x):
        return x >= self.SIZE
"""


def changed(new: str) -> list[tuple[str, str]]:
    old_lines, new_lines = SOURCE.splitlines(), new.splitlines()
    ops = difflib.SequenceMatcher(None, old_lines, new_lines).get_opcodes()
    return [(old_lines[i1].strip(), new_lines[j1].strip()) for tag, i1, _, j1, _ in ops if tag == "replace"]


EXPECTED = {
    ("flip_comparison", "if a < b and a is not None:"): "if a <= b and a is not None:",
    ("negate_membership", "if a < b and a is not None:"): "if a < b and a is None:",
    ("swap_boolean", "if a < b and a is not None:"): "if a < b or a is not None:",
    ("invert_condition", "if a < b and a is not None:"): "if not (a < b and a is not None):",
    ("off_by_one", "a += 1"): "a += 2",
    ("remove_statement", "a += 1"): "pass",
    ("swap_operands", "return a - b"): "return b - a",
    ("swap_arithmetic", "return a - b"): "return a + b",
    ("invert_condition", "elif not b:"): "elif b:",
    ("flip_return_bool", "return True"): "return False",
    ("remove_statement", "items.append(a)"): "pass",
    ("negate_membership", "print(a in items)"): "print(a not in items)",
    ("flip_comparison", "return x >= self.SIZE"): "return x > self.SIZE",
}


def test_every_site_is_a_single_line_change_and_compiles() -> None:
    sites = mutation_sites(SOURCE)
    seen = {}
    for site in sites:
        new, applied = mutate(SOURCE, site.index)
        assert applied == site
        (diff,) = changed(new)  # exactly one line differs
        compile(new, "m", "exec")
        seen[(site.operator, diff[0])] = diff[1]
        assert site.function in ("f", "g")  # module- and class-level code is never mutated
    for key, want in EXPECTED.items():
        assert seen.get(key) == want, key
    assert {op for op, _ in seen} == set(OPERATORS)
    assert "LIMIT = 3" not in {k[1] for k in seen} and "SIZE = 10" not in {k[1] for k in seen}


def test_deterministic_and_bounded() -> None:
    assert mutation_sites(SOURCE) == mutation_sites(SOURCE)
    assert mutate(SOURCE, 4) == mutate(SOURCE, 4)
    with pytest.raises(IndexError):
        mutate(SOURCE, len(mutation_sites(SOURCE)))
