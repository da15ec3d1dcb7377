"""The README is a short signpost: its Python snippet runs exactly as printed (and is the
quick start of the docs, word for word), it starts with the two commands (install and run
the main job; install and run the tests) that CI runs, it stays short and holds no history,
and every link in it leads to a file of the repository."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_python_use_snippet_runs(tmp_path, monkeypatch):
    section = README.split("## Python use", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    monkeypatch.chdir(tmp_path)
    for _ in range(2):          # twice in a row, as a reader re-running it would
        namespace: dict = {}
        exec(compile(code, "README.md", "exec"), namespace)
        out = namespace["out"]
        assert out.labels.shape == (100,) and out.guarantee.relation == "replace-one"
        assert Path(namespace["ledger_path"]).is_file()


def test_the_two_commands_come_first_and_ci_runs_the_test_command():
    blocks = re.findall(r"```bash\n(.*?)\n```", README, re.S)
    main_job, tests = blocks[0], blocks[1]
    assert "pip install" in main_job and "agt reproduce blobs" in main_job
    assert "pip install" in tests and "pytest" in tests
    ci = (ROOT / ".ci" / "run").read_text()
    assert tests.strip() in ci


def test_the_quick_start_is_one_text():
    """The README's snippet and the docs' quick start are the same code (one of them drifted
    before)."""
    code = re.search(r"```python\n(.*?)```", README.split("## Python use", 1)[1], re.S).group(1)
    assert code in (ROOT / "docs" / "getting-started.md").read_text()


def test_the_readme_is_a_short_signpost():
    assert len(README.splitlines()) <= 200
    for history in (r"since 0\.\d", r"before 0\.\d", r"review found", r"issue \d+", r"\(0\.\d\.\d"):
        assert not re.search(history, README), history


def test_every_readme_link_leads_to_a_file():
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README):
        if "://" not in target:
            assert (ROOT / target).is_file(), target
