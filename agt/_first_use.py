"""Imported for its effect, first thing, by the subpackages a program may import before any
facade name (``agt.certify``, ``agt.ensemble``): it gives the program the ``agt`` command's
threading settings before their modules load torch (`agt.threads.prepare_first_use`: once
per process; a warning instead when torch was imported first)."""

from agt.threads import prepare_first_use

prepare_first_use()
