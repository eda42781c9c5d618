"""Procedural bug injection with libcst: one small, syntactically valid change inside a function body.

Sites are enumerated in a fixed traversal order, so ``(source, site index)`` names a mutant exactly and a
seed picks the same mutants every time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

_FLIP: dict[type, type] = {
    cst.LessThan: cst.LessThanEqual,
    cst.LessThanEqual: cst.LessThan,
    cst.GreaterThan: cst.GreaterThanEqual,
    cst.GreaterThanEqual: cst.GreaterThan,
    cst.Equal: cst.NotEqual,
    cst.NotEqual: cst.Equal,
}
_ARITH: dict[type, type] = {
    cst.Add: cst.Subtract,
    cst.Subtract: cst.Add,
    cst.Multiply: cst.Divide,
    cst.Divide: cst.Multiply,
    cst.FloorDivide: cst.Multiply,
}
_NONCOMMUTATIVE = (cst.Subtract, cst.Divide, cst.FloorDivide, cst.Modulo, cst.Power)
OPERATORS = (
    "flip_comparison",
    "negate_membership",
    "off_by_one",
    "swap_operands",
    "swap_arithmetic",
    "swap_boolean",
    "invert_condition",
    "remove_statement",
    "flip_return_bool",
)


def _ws(op: Any) -> dict[str, Any]:
    """The operator's surrounding whitespace, so a replaced operator keeps the line's formatting."""
    return {"whitespace_before": op.whitespace_before, "whitespace_after": op.whitespace_after}


@dataclass(frozen=True)
class Site:
    """One mutation site: its index in traversal order, the operator and where it is."""

    index: int
    operator: str
    line: int
    function: str


class _Mutator(cst.CSTTransformer):
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, target: int | None) -> None:
        super().__init__()
        self.target = target
        self.sites: list[Site] = []
        self.functions: list[str] = []
        self.applied: Site | None = None

    # Only code inside functions: module- and class-level statements run at import time, where a bug
    # breaks everything at once instead of making a few tests fail.
    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        self.functions.append(node.name.value)
        return True

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> cst.FunctionDef:
        self.functions.pop()
        return updated

    def _site(self, node: cst.CSTNode, operator: str) -> bool:
        """Record a site; True when it is the one to mutate."""
        if not self.functions:
            return False
        site = Site(
            len(self.sites),
            operator,
            self.get_metadata(PositionProvider, node).start.line,
            self.functions[-1],
        )
        self.sites.append(site)
        if site.index == self.target:
            self.applied = site
            return True
        return False

    def leave_ComparisonTarget(
        self, original: cst.ComparisonTarget, updated: cst.ComparisonTarget
    ) -> cst.ComparisonTarget:
        op = updated.operator
        if type(op) in _FLIP:
            if self._site(original, "flip_comparison"):
                return updated.with_changes(operator=_FLIP[type(op)](**_ws(op)))
        elif isinstance(op, cst.In | cst.NotIn | cst.Is | cst.IsNot):
            if self._site(original, "negate_membership"):
                ws = _ws(op)
                new: cst.BaseCompOp
                if isinstance(op, cst.In):
                    new = cst.NotIn(**ws)
                elif isinstance(op, cst.NotIn):
                    new = cst.In(**ws)
                elif isinstance(op, cst.Is):
                    new = cst.IsNot(**ws)
                else:
                    new = cst.Is(**ws)
                return updated.with_changes(operator=new)
        return updated

    def leave_Integer(self, original: cst.Integer, updated: cst.Integer) -> cst.Integer:
        try:
            value = int(updated.value.replace("_", ""), 0)
        except ValueError:
            return updated
        if value < 1000 and self._site(original, "off_by_one"):
            return updated.with_changes(value=str(value + 1))
        return updated

    def leave_BinaryOperation(
        self, original: cst.BinaryOperation, updated: cst.BinaryOperation
    ) -> cst.BaseExpression:
        op = updated.operator
        if isinstance(op, _NONCOMMUTATIVE) and self._site(original, "swap_operands"):
            return updated.with_changes(left=updated.right, right=updated.left)
        if type(op) in _ARITH and self._site(original, "swap_arithmetic"):
            return updated.with_changes(operator=_ARITH[type(op)](**_ws(op)))
        return updated

    def leave_BooleanOperation(
        self, original: cst.BooleanOperation, updated: cst.BooleanOperation
    ) -> cst.BooleanOperation:
        op = updated.operator
        if self._site(original, "swap_boolean"):
            ws = {"whitespace_before": op.whitespace_before, "whitespace_after": op.whitespace_after}
            return updated.with_changes(operator=cst.Or(**ws) if isinstance(op, cst.And) else cst.And(**ws))
        return updated

    def leave_If(self, original: cst.If, updated: cst.If) -> cst.If:
        if self._site(original, "invert_condition"):
            test = updated.test
            if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
                return updated.with_changes(test=test.expression)
            if not test.lpar:
                test = test.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
            return updated.with_changes(test=cst.UnaryOperation(cst.Not(), test))
        return updated

    def leave_SimpleStatementLine(
        self, original: cst.SimpleStatementLine, updated: cst.SimpleStatementLine
    ) -> cst.SimpleStatementLine:
        if len(updated.body) != 1:
            return updated
        stmt = updated.body[0]
        removable = isinstance(stmt, cst.AugAssign) or (
            isinstance(stmt, cst.Expr) and isinstance(stmt.value, cst.Call)
        )
        if not removable:
            if isinstance(stmt, cst.Assign) and all(
                isinstance(t.target, cst.Attribute | cst.Subscript) for t in stmt.targets
            ):
                removable = True
        if removable and self._site(original, "remove_statement"):
            return updated.with_changes(body=[cst.Pass()])
        return updated

    def leave_Return(self, original: cst.Return, updated: cst.Return) -> cst.Return:
        value = updated.value
        if isinstance(value, cst.Name) and value.value in ("True", "False"):
            if self._site(original, "flip_return_bool"):
                return updated.with_changes(value=cst.Name("False" if value.value == "True" else "True"))
        return updated


def _run(source: str, target: int | None) -> tuple[str, _Mutator]:
    wrapper = MetadataWrapper(cst.parse_module(source))
    mutator = _Mutator(target)
    return wrapper.visit(mutator).code, mutator


def mutation_sites(source: str) -> list[Site]:
    """Every mutation site of ``source`` in traversal order."""
    return _run(source, None)[1].sites


def mutate(source: str, index: int) -> tuple[str, Site]:
    """``source`` with site ``index`` mutated; the new code always differs from the old."""
    code, mutator = _run(source, index)
    if mutator.applied is None:
        raise IndexError(f"no mutation site {index} (the module has {len(mutator.sites)})")
    assert code != source, mutator.applied
    compile(code, "<mutant>", "exec")  # a mutant is always valid Python
    return code, mutator.applied
