"""Every reason the operator writes is a `contract.Reason` member (users' alerts match
the strings), and docs/troubleshooting.md lists exactly those members."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from grpo_api.contract import FailureReason, Reason

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]
OPERATOR = ROOT / "operator/grpo_operator"


def _documented() -> set[str]:
    text = (ROOT / "docs/troubleshooting.md").read_text()
    table = text.split("\n## Reasons\n", 1)[1]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    return {name for row in rows for name in re.findall(r"`(\w+)`", row.split(" | ")[0])}


def test_the_reasons_table_lists_every_reason_and_no_other() -> None:
    documented = _documented()
    members = {r.value for r in Reason}
    assert documented - members == set(), "documented, but the operator never writes it"
    assert members - documented == set(), "written by the operator, missing in the docs"


def test_every_attempt_failure_class_but_success_is_a_reason() -> None:
    # finish_attempt turns the trainer's class into the phase reason (Reason(outcome)).
    assert {r.value for r in FailureReason} - {r.value for r in Reason} == {"Succeeded"}


def _literal_reasons(tree: ast.AST) -> list[tuple[int, str]]:
    """String literals where the operator writes a reason: a Finding's first argument,
    an event tuple ("Normal"/"Warning", reason, message), a condition's "reason" value."""
    found = []
    for node in ast.walk(tree):
        reason: ast.expr | None = None
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Finding" \
                and node.args:
            reason = node.args[0]
        elif isinstance(node, ast.Tuple) and len(node.elts) == 3 and isinstance(
                node.elts[0], ast.Constant) and node.elts[0].value in ("Normal", "Warning"):
            reason = node.elts[1]
        elif isinstance(node, ast.Dict):
            reason = next((v for k, v in zip(node.keys, node.values, strict=True)
                           if isinstance(k, ast.Constant) and k.value == "reason"), None)
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "_post" \
                and len(node.args) > 2:
            reason = node.args[2]
        if isinstance(reason, ast.Constant | ast.JoinedStr):
            found.append((node.lineno, ast.unparse(reason)))
    return found


def test_no_reason_is_a_string_literal_in_the_operator() -> None:
    literal = {f"{path.relative_to(ROOT)}:{line}: {text}"
               for path in OPERATOR.rglob("*.py")
               for line, text in _literal_reasons(ast.parse(path.read_text()))}
    assert literal == set()
