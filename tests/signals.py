"""Ctrl-C for the tests that interrupt an ``srdq`` process they started.

A command started as a background job of a script (``make test &``, ``nohup .ci/run &``) begins with SIGINT
ignored; its children inherit that, and Python then keeps SIGINT ignored instead of raising
KeyboardInterrupt. The SIGINT such a test sends would be dropped and the run would finish with exit 0. A
terminal's Ctrl-C reaches a foreground command whose SIGINT is at its default: ``default_sigint``, passed
as ``preexec_fn``, restores that default in the child before Python starts there."""

from __future__ import annotations

import signal


def default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
