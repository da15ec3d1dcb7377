"""MkDocs hooks: the reference tables that must not drift from the code are generated here,
at build time, from the code itself.

A page asks for a table with a marker line ``<!-- generated: NAME -->``; NAME is one of
`GENERATORS`. tests/test_docs.py builds the site strictly and checks each generator
against the code it reads.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MARKER = re.compile(r"^<!-- generated: ([a-z-]+) -->$", re.M)


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return " ".join(str(text).split()).replace("|", "\\|")


#: the registry audit's artifact (``agt audit --registry --out ...``)
AUDIT_ARTIFACT = ROOT / "artifacts" / "audit" / "registry.json"


def audited_cell(name: str, audited: dict) -> str:
    """The audit column's cell: the 95 % lower bound on eps at eps 1 and the exact loss of
    the audited neighbours, from the registry audit's artifact; "not audited" where the
    artifact has no entry."""
    row = audited.get(name)
    if row is None:
        return "not audited"
    bound = row["lower_bound"]
    exact = row.get("exact_loss")
    cell = f"{bound:.2f}" + ("" if exact is None else f" (exact {exact:.2f})")
    return cell + (" **violated**" if row.get("violated") else "")


def mechanism_table() -> str:
    """The registry, one row per mechanism (`mechanisms.base.describe_registry`), with the
    audited lower bound of each at eps 1 (`AUDIT_ARTIFACT`)."""
    import json

    from mechanisms.base import describe_registry

    audited = (json.loads(AUDIT_ARTIFACT.read_text(encoding="utf-8"))["mechanisms"]
               if AUDIT_ARTIFACT.is_file() else {})
    inputs = {"Certified": "one model", "Votes": "ensemble", "LinearModel": "linear model",
              "PerturbedObjective": "perturbed objective"}
    lines = ["| name | input | guarantee | classes | spends radii | what it does | "
             "audited lower bound at eps 1 |",
             "|---|---|---|---|---|---|---|"]
    for m in describe_registry():
        guarantee = ("eps" if m.pure else "(eps, delta)") + \
            (" per query" if m.per_query else " per release")
        classes = "any" if m.max_classes is None else f"at most {m.max_classes}"
        radii = "yes (smooth)" if m.spends_radii else "no"
        name = f"[`{m.name}`][{m.cls}]"
        lines.append(f"| {name} | {inputs.get(m.inputs, m.inputs)} | {guarantee} | "
                     f"{classes} | {radii} | {_cell(m.summary)} | "
                     f"{audited_cell(m.name, audited)} |")
    return "\n".join(lines)


def _option_row(action: argparse.Action) -> str:
    flags = ", ".join(f"`{f}`" for f in action.option_strings) or f"`{action.dest}`"
    if action.choices:
        value = " \\| ".join(f"`{c}`" for c in action.choices)
    elif action.nargs == 0:
        value = "(flag)"
    else:
        value = f"`{action.metavar or action.dest.upper()}`"
    default = action.default
    shown = "" if default in (None, False, argparse.SUPPRESS) else f"`{default}`"
    required = "yes" if action.required else ""
    return f"| {flags} | {value} | {required} | {shown} | {_cell(action.help or '')} |"


def cli_reference() -> str:
    """Every subcommand of ``agt``: its description and options, from the parser itself
    (`agt.cli.main.build_parser`)."""
    from agt.cli.main import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {c.dest: c.help for c in sub._choices_actions}
    out = []
    for name, command in sub.choices.items():
        out.append(f"## agt {name}\n")
        out.append(_cell(command.description or helps.get(name) or "") + "\n")
        out.append("```text\n" + command.format_usage().strip() + "\n```\n")
        rows = [a for a in command._actions if not isinstance(a, argparse._HelpAction)]
        out.append("| option | value | required | default | meaning |")
        out.append("|---|---|---|---|---|")
        out.extend(_option_row(a) for a in rows)
        out.append("")
    return "\n".join(out)


def config_reference() -> str:
    """Every training-config key (`agt.config.config_reference`)."""
    from agt.config import config_reference as rows

    lines = ["| key | default | values | meaning |", "|---|---|---|---|"]
    for row in rows():
        values = ", ".join(f"`{c}`" for c in row.choices)
        lines.append(f"| `{row.name}` | `{row.default}` | {values} | {_cell(row.doc)} |")
    return "\n".join(lines)


def changelog() -> str:
    """CHANGELOG.md without its title (the page has its own)."""
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    return text.split("\n", 1)[1] if text.startswith("# ") else text


def pate_table() -> str:
    """The committed PATE table (artifacts/pate/summary.md, without its title), so the page
    shows what `agt reproduce pate` measured rather than a copy that could go stale."""
    text = (ROOT / "artifacts" / "pate" / "summary.md").read_text(encoding="utf-8")
    return text.split("\n", 1)[1].strip() if text.startswith("# ") else text


GENERATORS = {"mechanism-table": mechanism_table, "cli-reference": cli_reference,
              "config-reference": config_reference, "changelog": changelog,
              "pate-table": pate_table}


def render(markdown: str) -> str:
    """Replace every marker line by its generated Markdown."""
    def replace(match: re.Match) -> str:
        name = match.group(1)
        if name not in GENERATORS:
            raise KeyError(f"unknown generated section {name!r}; known: {sorted(GENERATORS)}")
        return GENERATORS[name]()
    return MARKER.sub(replace, markdown)


def on_page_markdown(markdown: str, **kwargs) -> str:
    return render(markdown)


def on_files(files, config, **kwargs):
    """The figures of artifacts/ join the site under the same paths, so the results pages
    show the committed figures themselves rather than copies that could go stale."""
    from mkdocs.structure.files import File

    for png in sorted((ROOT / "artifacts").rglob("*.png")):
        files.append(File(str(png.relative_to(ROOT)), src_dir=str(ROOT),
                          dest_dir=config["site_dir"],
                          use_directory_urls=config["use_directory_urls"]))
    return files
