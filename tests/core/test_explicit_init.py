"""Dataclasses that write their ``__init__`` out (``init=False``) keep it in step with their
fields: same names in the same order, the same defaults, every field set exactly once.

The hot value classes of the call path write ``__init__`` by hand so that the compiled build
(mypyc) compiles it; dataclass's generated one runs interpreted. A field added to the class
body but not to ``__init__`` would leave its slot unset, which this catches from the source.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "inferplane"


def _explicit_init_classes() -> list[tuple[str, ast.ClassDef]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and any(
                _is_init_false(d) for d in node.decorator_list
            ):
                found.append((f"{path.relative_to(PACKAGE)}:{node.name}", node))
    return found


def _is_init_false(deco: ast.expr) -> bool:
    return (
        isinstance(deco, ast.Call)
        and getattr(deco.func, "id", "") == "dataclass"
        and any(k.arg == "init" and getattr(k.value, "value", True) is False for k in deco.keywords)
    )


def _fields(cls: ast.ClassDef) -> list[ast.AnnAssign]:
    return [
        s
        for s in cls.body
        if isinstance(s, ast.AnnAssign)
        and isinstance(s.target, ast.Name)
        and "ClassVar" not in ast.unparse(s.annotation)
    ]


def _init(cls: ast.ClassDef) -> ast.FunctionDef:
    inits = [s for s in cls.body if isinstance(s, ast.FunctionDef) and s.name == "__init__"]
    assert len(inits) == 1, f"{cls.name}: init=False needs one written-out __init__"
    return inits[0]


def _assigned(init: ast.FunctionDef) -> list[str]:
    """Field names ``__init__`` sets: ``object.__setattr__(self, "x", ...)`` or ``self.x = ...``."""
    names = []
    for node in ast.walk(init):
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "object.__setattr__":
            first, name = node.args[0], node.args[1]
            if (
                isinstance(first, ast.Name)
                and first.id == "self"
                and isinstance(name, ast.Constant)
            ):
                names.append(str(name.value))
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Attribute) and ast.unparse(target.value) == "self":
                    names.append(target.attr)
    return names


CLASSES = _explicit_init_classes()


def test_the_hot_value_classes_are_found() -> None:
    names = {name.rsplit(":", 1)[1] for name, _ in CLASSES}
    assert {"CallContext", "EndpointView", "RequestRecord", "LatencyEstimate"} <= names


@pytest.mark.parametrize(("where", "cls"), CLASSES, ids=[name for name, _ in CLASSES])
def test_init_matches_the_fields(where: str, cls: ast.ClassDef) -> None:
    fields, init = _fields(cls), _init(cls)
    params = init.args.args[1:]
    assert [p.arg for p in params] == [
        f.target.id for f in fields if isinstance(f.target, ast.Name)
    ]
    defaults = [None] * (len(params) - len(init.args.defaults)) + list(init.args.defaults)
    for field, param, default in zip(fields, params, defaults, strict=True):
        if field.value is None:
            assert default is None, f"{param.arg}: the field has no default, __init__ has one"
            continue
        assert default is not None, f"{param.arg}: the field has a default, __init__ none"
        declared = ast.unparse(field.value)
        if declared.startswith("field(default_factory="):
            assert ast.unparse(default) == "None", f"{param.arg}: a factory default is None"
        else:
            assert ast.unparse(default) == declared, f"{param.arg}: defaults differ"
    assigned = _assigned(init)
    assert sorted(assigned) == sorted(p.arg for p in params), "every field set exactly once"
