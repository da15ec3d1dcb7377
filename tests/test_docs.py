"""The documentation is part of the product: it builds strictly (a broken link, a missing
page or a bad docstring fails), its tutorials run as printed, its generated references
cover the code they are generated from, and the code lints clean."""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def _hooks():
    spec = importlib.util.spec_from_file_location("agt_docs_hooks", DOCS / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _blocks(page: Path) -> list[tuple[str, str]]:
    """The runnable blocks of a page, in order: (language, code) for python and bash
    (install commands, which need a fresh machine, are not run here; CI runs them)."""
    found = re.findall(r"^```(python|bash)\n(.*?)^```", page.read_text(), re.S | re.M)
    return [(lang, code) for lang, code in found if not code.startswith("python3 -m venv")]


def _run_page(page: Path, workdir: Path) -> None:
    """Run a page's blocks in one folder, in page order: consecutive python blocks as one
    script (one interpreter session, as a reader would run them), bash blocks with
    ``bash -e``. ``configs/`` is linked in, so commands written for the repository root run
    as printed."""
    (workdir / "configs").symlink_to(ROOT / "configs")
    env = dict(os.environ, MPLBACKEND="Agg")
    steps: list[tuple[str, str]] = []
    for lang, code in _blocks(page):
        if lang == "python" and steps and steps[-1][0] == "python":
            steps[-1] = ("python", steps[-1][1] + "\n" + code)
        else:
            steps.append((lang, code))
    for lang, code in steps:
        cmd = [sys.executable, "-c", code] if lang == "python" else ["bash", "-e", "-c", code]
        out = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True,
                             timeout=600)
        assert out.returncode == 0, f"{page.name}: block failed\n{code}\n{out.stderr[-3000:]}"


TUTORIALS = sorted((DOCS / "tutorials").glob("*.md"))


@pytest.mark.slow
@pytest.mark.parametrize("page", TUTORIALS, ids=[p.stem for p in TUTORIALS])
def test_tutorials_run_as_printed(page, tmp_path):
    _run_page(page, tmp_path)


def test_the_getting_started_commands_run(tmp_path):
    (tmp_path / "runs").mkdir()
    _run_page(DOCS / "getting-started.md", tmp_path)
    assert (tmp_path / "runs" / "labels.csv").is_file()


@pytest.mark.slow
def test_the_site_builds_strictly(tmp_path):
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                          str(tmp_path / "site")], cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    assert (tmp_path / "site" / "choosing-a-mechanism" / "index.html").is_file()


def test_every_page_is_in_the_navigation():
    import yaml

    nav = (ROOT / "mkdocs.yml").read_text()
    listed = set(re.findall(r":\s*([\w/-]+\.md)\s*$", nav, re.M))
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    assert pages == listed, pages ^ listed
    assert yaml is not None


def test_the_mechanism_table_lists_every_registered_mechanism():
    import mechanisms

    table = _hooks().mechanism_table()
    rows = [line for line in table.splitlines()[2:]]
    assert len(rows) == len(mechanisms.MECHANISMS)
    for name in mechanisms.MECHANISMS:
        assert f"[`{name}`]" in table
    # the metadata is read off the objects: a binary mechanism says so, a session too
    assert re.search(r"\[`gs`\].*\| at most 2 \|", table)
    assert re.search(r"\[`svt`\].*per release", table)
    assert re.search(r"\[`exp-radius`\].*\| any \| yes", table)


def test_the_cli_reference_covers_every_option_of_every_command():
    from agt.cli.main import build_parser

    text = _hooks().cli_reference()
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for name, command in sub.choices.items():
        section = text.split(f"## agt {name}\n", 1)[1].split("\n## agt ", 1)[0]
        for action in command._actions:
            for flag in action.option_strings:
                if flag not in ("-h", "--help"):
                    assert f"`{flag}`" in section, (name, flag)


def test_the_configuration_reference_covers_every_key():
    from agt.config import _FIELDS

    text = _hooks().config_reference()
    for key in _FIELDS:
        assert f"| `{key}` |" in text, key
    assert "| `bound_method` | `served-k0` |" in text


def test_a_page_that_asks_for_an_unknown_table_fails_the_build():
    with pytest.raises(KeyError, match="unknown generated section"):
        _hooks().render("<!-- generated: no-such-table -->")


def test_the_code_lints_clean():
    out = subprocess.run([sys.executable, "-m", "ruff", "check", "."], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
