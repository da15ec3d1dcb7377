"""Reading experiment plan files: the one loader behind every ``agt reproduce`` study.

A plan file is a YAML mapping in ``configs/experiments/``. Each study decides which keys it
has; this module does what every study's loader needs:

  `read_plan`       the file's mapping (keys given twice refused, as for training configs)
  `apply_quick`     the file without its ``quick:`` section, or with that section laid
                    over it for ``--quick`` (`overlay`)
  `build_settings`  a frozen settings dataclass from a mapping: unknown keys refused,
                    values coerced to the defaults' types, the class's own checks run, and
                    every problem of the section raised together as one ConfigError

Users: `experiments.plan.load_plan` (the blobs / octmnist / imdb plans) and
`experiments.tradeoffs.settings.load_settings` (the trade-off study).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import yaml

from agt.config import load_yaml
from agt.errors import ConfigError, Problems

PLAN_DIR = Path(__file__).resolve().parent.parent / "configs" / "experiments"


def read_plan(path: Path, what: str) -> dict:
    """The mapping a plan file holds.

    Args:
        path: the plan file, named as given in every message.
        what: what the file is, for messages ("experiment plan", "trade-off plan").

    Returns:
        The file's top-level mapping; an empty file is an empty mapping.

    Raises:
        ConfigError: the file is missing, unreadable, not YAML, gives a key twice, or holds
            something other than a mapping.
    """
    if not path.is_file():
        raise ConfigError(f"{what} not found: {path}")
    try:
        raw = load_yaml(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read the {what} {path}: {exc}") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        article = "an" if what[:1] in "aeiou" else "a"
        raise ConfigError(f"{path} must hold a YAML mapping ({article} {what})")
    return raw


def overlay(base: Any, over: Any, depth: int) -> Any:
    """`over` laid over `base`: mappings are merged key by key down to `depth` levels, any
    other value (and everything deeper) is replaced.

    A null where `depth` >= 2 stands for an empty section (YAML's ``single:`` with nothing
    under it) and changes nothing; at the last merged level null is a value of its own
    (``max_train: null`` keeps every record), so it replaces.

    Args:
        base: the value being overridden (None or missing: nothing to keep).
        over: the overriding value.
        depth: how many levels of mappings are merged (0: `over` replaces `base`; 1:
            ``{**base, **over}``).

    Returns:
        The merged value; neither argument is changed.
    """
    if depth >= 2 and over is None:
        return base
    if depth <= 0 or not isinstance(over, Mapping):
        return over
    out = dict(base) if isinstance(base, Mapping) else {}
    for key, value in over.items():
        out[key] = overlay(out.get(key), value, depth - 1)
    return out


def apply_quick(raw: Mapping, quick: bool, where: str,
                sections: Mapping[str, int] | None = None) -> dict:
    """A plan without its ``quick:`` section, or with that section laid over it.

    The section is checked either way, so a plan whose quick section is broken is refused
    by the full run too.

    Args:
        raw: the plan file's mapping (`read_plan`).
        quick: whether to apply the section.
        where: the plan file, for messages.
        sections: the keys ``quick:`` may override, each with the depth `overlay` merges it
            to (in the order the message lists them); None lets it override any key, each
            value replacing the plan's whole.

    Returns:
        A new mapping without the ``quick`` key; `raw` is not changed.
    """
    over = raw.get("quick") or {}
    if not isinstance(over, Mapping):
        raise ConfigError(f"{where}: quick must be a mapping of overrides")
    if sections is not None:
        bad = sorted(set(over) - set(sections))
        if bad:
            names = list(sections)
            listed = ", ".join(names[:-1]) + f" and {names[-1]}" if len(names) > 1 else names[0]
            raise ConfigError(f"{where}: quick may override {listed} only, got {bad}")
    merged = {key: value for key, value in raw.items() if key != "quick"}
    if quick:
        for key, value in over.items():
            depth = 0 if sections is None else sections[key]
            merged[key] = overlay(merged.get(key), value, depth)
    return merged


def _coerce(value: Any, default: Any, where: str) -> Any:
    """A YAML value as the type of the field's default (lists become tuples, so that the
    settings stay hashable and frozen)."""
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ConfigError(f"{where} must be true or false, got {value!r}")
        return value
    if isinstance(default, int) and not isinstance(default, bool):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise ConfigError(f"{where} must be an integer, got {value!r}")
        return int(value)
    if isinstance(default, float):
        if isinstance(value, str):
            try:
                value = float(value)  # YAML 1.1 reads 1e-5 (no dot) as a string
            except ValueError:
                raise ConfigError(f"{where} must be a number, got {value!r}") from None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                not math.isfinite(value):
            raise ConfigError(f"{where} must be a finite number, got {value!r}")
        return float(value)
    if isinstance(default, tuple):
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where} must be a list, got {value!r}")
        return tuple(value)
    if isinstance(default, dict):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where} must be a mapping, got {value!r}")
        return dict(value)
    return value


def build_settings(cls, raw: Any, where: str):
    """``cls(**raw)``, checked.

    Args:
        cls: a frozen dataclass whose fields have defaults and which has
            ``validate(where, problems)`` adding its own problems to a `Problems`.
        raw: the section's mapping (None: every default).
        where: the section's name in messages (``settings.single``, ``tradeoffs.yaml``).

    Returns:
        The settings object. A null value keeps None (the field's "unset"), a field whose
        default is None takes the value as written; the rest are coerced to the default's
        type.

    Raises:
        ConfigError: every problem of the section at once (unknown keys, wrong types, then
            the class's checks).
    """
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where} must be a mapping of settings, got {raw!r}")
    problems = Problems(kind=ConfigError)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        problems.add(f"unknown setting(s) {unknown} in {where}; allowed: "
                     f"{', '.join(sorted(fields))}")
    values = {}
    for name, value in raw.items():
        if name not in fields:
            continue
        f = fields[name]
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
        try:
            values[name] = value if (value is None or default is None) else \
                _coerce(value, default, f"{where}.{name}")
        except ConfigError as exc:
            problems.add(str(exc))
    problems.raise_if_any()
    obj = cls(**values)
    obj.validate(where, problems)
    problems.raise_if_any()
    return obj
