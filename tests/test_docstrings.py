"""Every public name of the `agt` and `mechanisms` facades documents its interface: a
docstring with Args (when it takes arguments), Returns (unless it returns None) and Raises
(when its body raises), for functions, classes and the public methods of classes."""

from __future__ import annotations

import ast
import inspect
import textwrap

import agt
import mechanisms


def _raises(func) -> bool:
    """Whether the function's own body has a ``raise`` statement (not a bare re-raise)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    except (OSError, TypeError, SyntaxError):
        return False
    body = tree.body[0]
    nested = {id(n) for d in ast.walk(body) if d is not body and
              isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
              for n in ast.walk(d)}
    return any(isinstance(n, ast.Raise) and n.exc is not None and id(n) not in nested
               for n in ast.walk(body))


def _takes_arguments(func) -> bool:
    try:
        params = inspect.signature(func).parameters
    except (TypeError, ValueError):
        return False
    return any(p not in ("self", "cls") for p in params)


def _returns_something(func) -> bool:
    try:
        return inspect.signature(func).return_annotation not in (None, "None")
    except (TypeError, ValueError):
        return True


def _function_problems(where: str, func) -> list[str]:
    doc = inspect.getdoc(func) or ""
    problems = []
    if not doc:
        return [f"{where}: no docstring"]
    if _takes_arguments(func) and "Args:" not in doc:
        problems.append(f"{where}: no Args section")
    if _returns_something(func) and "Returns:" not in doc and "Yields:" not in doc:
        problems.append(f"{where}: no Returns section")
    if _raises(func) and "Raises:" not in doc:
        problems.append(f"{where}: raises, but no Raises section")
    return problems


def _class_problems(where: str, cls) -> list[str]:
    doc = (cls.__doc__ or "").strip()
    # a dataclass without a docstring gets its signature as __doc__
    documented = doc and not doc.startswith(f"{cls.__name__}(")
    problems = [] if documented else [f"{where}: no class docstring"]
    if issubclass(cls, BaseException):
        return problems
    for name, member in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(member, property):
            if not (member.__doc__ or "").strip():
                problems.append(f"{where}.{name}: property without a docstring")
        elif isinstance(member, (staticmethod, classmethod)):
            problems += _function_problems(f"{where}.{name}", member.__func__)
        elif inspect.isfunction(member):
            problems += _function_problems(f"{where}.{name}", member)
    return problems


def _undocumented() -> list[str]:
    problems = []
    for package in (agt, mechanisms):
        for name in package.__all__:
            obj = getattr(package, name)
            where = f"{package.__name__}.{name}"
            if inspect.isclass(obj):
                problems += _class_problems(where, obj)
            elif inspect.isfunction(obj):
                problems += _function_problems(where, obj)
    return problems


def test_every_public_name_has_args_returns_and_raises():
    problems = _undocumented()
    assert not problems, f"{len(problems)} interface docs missing:\n" + "\n".join(problems)


def test_the_counter_catches_a_missing_section():
    def documented(x: int) -> int:
        """Double.

        Args:
            x: a number.

        Returns:
            2 x.
        """
        return 2 * x

    def undocumented(x: int) -> int:
        """Double."""
        if x < 0:
            raise ValueError("negative")
        return 2 * x

    assert _function_problems("documented", documented) == []
    assert _function_problems("undocumented", undocumented) == [
        "undocumented: no Args section", "undocumented: no Returns section",
        "undocumented: raises, but no Raises section"]
