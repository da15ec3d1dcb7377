"""The command line: ``agt train | inspect | certify | predict | teacher-labels | reproduce``.

The application layer: one module per command that parses, calls the public library (`agt`,
`mechanisms`, `experiments`) and prints. Nothing outside this package imports it.
"""

from agt.cli.main import build_parser, main

__all__ = ["main", "build_parser"]
