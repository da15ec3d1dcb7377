"""The layers point one way (docs/design.md, Layers), checked on the import graph of the source:

  agt (engine)  <-  mechanisms (noise, accounting, ledger; only agt.errors)
        ^                ^
        +--- experiments (library only, never the CLI) --- agt.cli (the application)

No import circle between modules; nothing outside agt/cli imports it; the engine never
imports mechanisms; release noise is drawn only inside mechanism objects, and only the
ledger calls a mechanism's release. Importing the packages is cheap and has no side effect
(no torch behind ``import mechanisms``, no environment variable changed), and the repository
stands on its own: no file refers to a path outside it."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("agt", "mechanisms", "experiments")


def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The project module an import names (the longest known prefix), or None."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in MODULES:
            return candidate
        parts.pop()
    return None


def imports_of(module: str) -> set[str]:
    """Project modules imported anywhere in `module` (function-level imports included):
    ``from X import Y`` names X.Y when that is a module, else X."""
    found = set()
    for node in ast.walk(ast.parse(MODULES[module].read_text())):
        if isinstance(node, ast.Import):
            targets = [_resolve(a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in MODULES
                       else _resolve(node.module) for a in node.names]
        else:
            continue
        found.update(t for t in targets if t is not None and t != module)
    return found


GRAPH = {m: imports_of(m) for m in MODULES}


def test_no_import_circle():
    # the package __init__ files re-export their modules; a module importing its own
    # package's __init__ would close a circle, so __init__ nodes are kept in the graph
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in GRAPH[node]:
            if state.get(nxt) == 1:
                cycle = stack[stack.index(nxt):] + [nxt]
                pytest.fail("import circle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for m in sorted(GRAPH):
        if m not in state:
            visit(m)


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_layers_point_one_way():
    """The application layer (the command line and the prediction service) sits on top;
    only the command line imports the service."""
    problems = []
    for module, targets in GRAPH.items():
        in_cli = _in(module, "agt.cli") or _in(module, "agt.service")
        for t in targets:
            if _in(t, "agt.cli") and not _in(module, "agt.cli"):
                problems.append(f"{module} imports the CLI ({t})")
            if _in(t, "agt.service") and not in_cli:
                problems.append(f"{module} imports the service ({t})")
            if module.startswith("agt") and not in_cli and t.startswith("mechanisms"):
                problems.append(f"engine module {module} imports {t}")
            if module.startswith("mechanisms") and t.startswith("agt") and t != "agt.errors":
                problems.append(f"{module} imports {t} (mechanisms depend on agt.errors only)")
            if module.startswith("agt") and not in_cli and t.startswith("experiments"):
                problems.append(f"{module} imports the experiments ({t})")
    assert not problems, "; ".join(problems)


NOISE_CALLS = {"laplace", "standard_cauchy", "cauchy", "gumbel", "exponential", "normal",
               "standard_normal", "choice", "random", "integers", "uniform", "gamma",
               "standard_exponential", "standard_gamma", "multivariate_normal"}
#: the mechanism modules and the two sampler modules they draw through (noise.py: closed
#: forms and float draws; exact.py: exact discrete samplers), each fed the mechanism's generator
NOISE_MODULES = {"mechanisms.global_sens", "mechanisms.smooth", "mechanisms.ensemble",
                 "mechanisms.noise", "mechanisms.exact", "mechanisms.radius",
                 "mechanisms.convex", "mechanisms.loss_perturbation", "mechanisms.pate",
                 # the sanitised cost's draw, called by Ledger.release_estimate only (below)
                 "mechanisms.pate_costs"}


def _calls(module: str):
    for node in ast.walk(ast.parse(MODULES[module].read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            yield node


def test_release_noise_is_drawn_only_inside_mechanism_objects():
    """No numpy-generator draw in mechanisms/ outside the modules that define mechanisms;
    and only the ledger calls `mechanism.release` or a session's draws (experiments, the CLI
    and the prediction service go through `Ledger.release` and `Ledger.answer_batch`)."""
    problems = []
    for module in MODULES:
        for call in _calls(module):
            name = call.func.attr
            if module.startswith("mechanisms") and name in NOISE_CALLS \
                    and module not in NOISE_MODULES:
                problems.append(f"{module}:{call.lineno} draws {name}")
            # the audit (mechanisms/audit/core.py) draws releases of the mechanism under
            # test from its own seeded generators to estimate their law: a test bench whose
            # results are owner-only statistics, never a released label
            if name in ("release", "open_session", "continue_session") and \
                    module.split(".")[:2] != ["mechanisms", "ledger"] and \
                    module != "mechanisms.audit.core":
                owner = ast.unparse(call.func.value)
                if "ledger" not in owner.lower():
                    problems.append(f"{module}:{call.lineno} calls {owner}.{name} directly")
            if name == "draw" and module.startswith(("agt", "experiments")):
                problems.append(f"{module}:{call.lineno} draws a sanitised cost outside the "
                                f"ledger")
    assert not problems, "; ".join(problems)


def test_experiments_and_cli_draw_no_noise_of_their_own():
    problems = []
    for module in MODULES:
        if module.startswith("experiments") or module.startswith("agt.cli"):
            for call in _calls(module):
                if call.func.attr in ("laplace", "standard_cauchy", "cauchy", "gumbel"):
                    problems.append(f"{module}:{call.lineno} draws {call.func.attr}")
    assert not problems, "; ".join(problems)


def _run_python(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


def test_importing_mechanisms_or_agt_loads_no_torch():
    """The registry, the ledger and the accountants need no tensors: ``import mechanisms``
    (and ``import agt``, which it reaches through agt.errors) stays cheap (PEP 562 facades)."""
    loaded = json.loads(_run_python(
        "import json, sys, mechanisms, agt, agt.client\n"
        "print(json.dumps([m for m in ('torch', 'h5py', 'opacus', 'scipy') if m in sys.modules]))"))
    assert loaded == []


def test_importing_the_packages_changes_no_environment_variable():
    """Only the command line sets variables (agt.threads.apply_recommended_environment);
    a library import must leave the user's process as it found it."""
    changed = json.loads(_run_python(
        "import json, os\n"
        "before = dict(os.environ)\n"
        "import agt, mechanisms, experiments, agt.cli, agt.training, mechanisms.ledger\n"
        "import experiments.runner\n"
        "after = dict(os.environ)\n"
        "print(json.dumps(sorted(k for k in set(before) | set(after)\n"
        "                        if before.get(k) != after.get(k))))"))
    assert changed == []


def test_the_public_names_resolve_lazily():
    """Every name a facade lists in __all__ resolves (a typo in its table would only show
    when a user first touched the name)."""
    import agt
    import mechanisms

    for package in (agt, mechanisms):
        for name in package.__all__:
            assert getattr(package, name) is not None, f"{package.__name__}.{name}"
    assert len(mechanisms.MECHANISMS) >= 20


def test_loading_the_certify_module_keeps_the_certify_function():
    """``agt.certify`` is the public function; the import system would set the submodule of
    the same name on the package when it first loads (lazily, after the function exists)."""
    code = ("import agt, types\n"
            "import agt.certify\n"
            "from agt.certify import Certifier\n"
            "print(type(agt.certify).__name__, agt.Certifier is Certifier)")
    assert _run_python(code) == "function True"


#: what no file of the repository may name: the team's notes and papers live beside it, not
#: in it, so a user who followed such a reference would find nothing
OUTSIDE = re.compile(r"DESIGN\.md|STYLE\.md|DEVELOPERS\.md|\.\./shared|shared/reference|"
                     r"(agt-certification-private-prediction|cs208-ml-under-dp-slides|"
                     r"dwork-feldman-privacy-preserving-prediction|"
                     r"tradeoffs-of-private-prediction)\.(txt|md)")


def _tracked_text_files():
    listed = subprocess.run(["git", "ls-files", "-z"], capture_output=True, cwd=ROOT)
    if listed.returncode != 0:      # not a git checkout (an sdist): every file on disk
        paths = [p for p in ROOT.rglob("*") if p.is_file() and ".venv" not in p.parts
                 and ".git" not in p.parts]
    else:
        paths = [ROOT / name for name in listed.stdout.decode().split("\0") if name]
    for path in paths:
        if path.suffix in (".png", ".pdf", ".svg", ".h5", ".npz", ".db", ".pt") or \
                not path.is_file():
            continue
        try:
            yield path, path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue


def test_no_file_refers_to_a_path_outside_the_repository():
    found = [f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}"
             for path, text in _tracked_text_files()
             if path.name != "test_architecture.py"
             for m in OUTSIDE.finditer(text)]
    assert not found, "; ".join(found[:20])
