"""Entry point: the parser of every command and the error contract.

Every user error is an `AGTError`: printed as one line ``agt: error: ...`` on stderr with exit
status 2, and no partial output file is left behind (agt/io.py). Bad option values are
argparse's one-line usage errors (also exit 2). SIGTERM (what `timeout` and batch schedulers
send) is handled like Ctrl-C: temporary files are removed and the exit status is 130
(143 for SIGTERM). A closed stdout (``agt inspect b.h5 | head``) ends the command quietly.

Before anything loads torch, `main` puts OMP_WAIT_POLICY=PASSIVE (spinning OpenMP threads
make small tensor ops many times slower next to another busy process) and
CUBLAS_WORKSPACE_CONFIG=:4096:8 (deterministic cuBLAS) in the environment, unless the user
set them (`agt.threads.apply_recommended_environment`). Parsing loads no torch, so every
``--help`` answers at once.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

from agt.errors import AGTError
from agt.threads import apply_recommended_environment

EXIT_USAGE = 2


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the program is so that cleanup handlers run."""


def _on_sigterm(signum, frame):
    raise _Terminated()


def _notes(exc: BaseException) -> str:
    """What the interrupted code added (e.g. that the ledger had recorded a spend)."""
    return "".join(f"; {note}" for note in getattr(exc, "__notes__", ()))


def build_parser() -> argparse.ArgumentParser:
    from agt.cli import (
        audit,
        backup,
        certify,
        inspect,
        keys,
        plan,
        predict,
        reproduce,
        serve,
        teacher_labels,
        train,
        tune,
    )

    p = argparse.ArgumentParser(prog="agt", description="Abstract Gradient Training: sound "
                                "parameter bounds and smooth-sensitivity private prediction")
    sub = p.add_subparsers(dest="command", required=True)
    for module in (train, tune, inspect, certify, plan, predict, teacher_labels, reproduce,
                   serve, keys, backup, audit):
        module.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    apply_recommended_environment()
    # first, so that a SIGTERM at any later moment (a loaded machine may deliver it while
    # the parser still imports) ends in the cleanup below, never in the default action
    previous = signal.getsignal(signal.SIGTERM)
    try:
        signal.signal(signal.SIGTERM, _on_sigterm)
    except ValueError:          # not the main thread: leave signals alone
        previous = None
    try:
        args = build_parser().parse_args(argv)
        return args.func(args)
    except AGTError as exc:
        print(f"agt: error: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}",
              file=sys.stderr)
        return EXIT_USAGE
    except _Terminated as exc:
        print("agt: terminated" + _notes(exc), file=sys.stderr)
        return 143
    except KeyboardInterrupt as exc:
        print("agt: interrupted" + _notes(exc), file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader went away (e.g. `| head`): nothing left to say; silence the flush error
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
