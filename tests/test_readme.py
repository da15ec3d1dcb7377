"""The README's Python snippet runs exactly as printed, and the README starts with the two
commands (install and run the main job; install and run the tests) that CI runs."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_python_use_snippet_runs(tmp_path, monkeypatch):
    section = README.split("## Python use", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)
    out = namespace["out"]
    assert out.labels.shape == (100,) and out.guarantee.relation == "replace-one"
    assert (tmp_path / "ledger.db").is_file()


def test_the_two_commands_come_first_and_ci_runs_the_test_command():
    blocks = re.findall(r"```bash\n(.*?)\n```", README, re.S)
    main_job, tests = blocks[0], blocks[1]
    assert "pip install" in main_job and "agt reproduce blobs" in main_job
    assert "pip install" in tests and "pytest" in tests
    ci = (ROOT / ".ci" / "run").read_text()
    assert tests.strip() in ci
