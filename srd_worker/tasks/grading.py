"""Final-answer extraction and math equivalence grading shared by the math tasks.

Follows the common MATH / GSM8K evaluation practice: the final answer is the content of the *last*
``\\boxed{...}`` (or ``\\fbox{...}``) in a response, read with balanced braces; GSM8K-style responses may
instead fall back to the last number in the text (a flag, off for MATH). Equivalence is decided by
HuggingFace's math-verify (``parse`` + ``verify``), with both sides wrapped in ``\\boxed{}`` so LaTeX such
as ``\\left( 3, \\frac{\\pi}{2} \\right)`` parses.

Timeouts: math-verify's own timeouts use ``signal.alarm``, which only works on the main thread, so they are
switched off (``parsing_timeout=None``, ``timeout_seconds=None``). A thread-based timeout is not enough
either: sympy does big-integer arithmetic in C while holding the GIL (``9^{9^{9^{9}}}+1`` never returns),
which starves the waiting thread too. So every comparison runs in a small pool of long-lived grader
subprocesses (``python -c`` importing this module, JSON lines over pipes); one that overruns ``timeout_s``
is killed and replaced, and the grade is False (logged). ``math_equal`` is safe to call from any thread.

The last-number fallback reads a fraction whole (``3/4``, as a GSM8K-layout gold may be; grader 2: grader
1 read its denominator).

Left out: memory limits on the grader subprocesses; Windows (the pipe reads use ``select``); the
``\\boxed 5`` form beyond one token; multiple-choice letters, unit stripping and the other heuristic
normalisations of older MATH graders (math-verify does the normalisation).
"""

from __future__ import annotations

import atexit
import functools
import json
import logging
import os
import re
import select
import subprocess
import sys
import threading
import time
from fractions import Fraction
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from srd_worker.errors import ItemError

logger = logging.getLogger(__name__)

try:
    _MATH_VERIFY_VERSION = version("math-verify")
except PackageNotFoundError:  # pragma: no cover - math-verify imports above, so it is installed
    _MATH_VERIFY_VERSION = "unknown"

#: Recorded with every grade so results from different grader logic are never mixed silently.
GRADER_VERSION: str = f"srdq-grader-2+math-verify-{_MATH_VERIFY_VERSION}"

#: Default wall-clock limit for one ``math_equal`` call, in seconds.
DEFAULT_TIMEOUT_S: float = 5.0

_BOXED_RE = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
# A number as written in a response: optional sign, digits with optional thousands commas, decimals.
_NUMBER_RE = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|-?\.\d+")
# A fraction as written in a response (``3/4``, ``-7/2``), not part of a longer chain such as a date
# ``3/4/2020`` or a ratio ``1/2/3``.
_FRACTION_RE = re.compile(r"(?<![\d/.,])-?\d+/\d+(?![\d/])")
# A plain number answer: sign, digits with decimals, or a ratio (``-3``, ``18.00``, ``.5``, ``7/2``).
_PLAIN_NUMBER_RE = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:/\d+)?")
# A gold answer that is a plain number as a dataset writes it (thousands commas allowed): "1,250", "-3.5".
_GOLD_NUMBER_RE = re.compile(r"^-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?$|^-?\.\d+$")
_THOUSANDS_RE = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")


class _SuppressTimeoutDisabledWarning(logging.Filter):
    """Drops math-verify's one-time "timeout is disabled" warning: this module does the timeout itself."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Timeout is disabled" not in record.getMessage()


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_SuppressTimeoutDisabledWarning())


def extract_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` / ``\\fbox{...}`` in ``text`` (braces balanced), else None.

    If the last occurrence is never closed (e.g. a truncated response) the result is None: an earlier,
    superseded answer is not used. ``\\boxed 5`` (one token, no braces) is accepted too.
    """
    matches = list(_BOXED_RE.finditer(text))
    if not matches:
        return None
    pos = matches[-1].end()
    while pos < len(text) and text[pos] in " \t":
        pos += 1
    if pos >= len(text):
        return None
    if text[pos] != "{":
        token = re.match(r"[^\s${}]+", text[pos:])
        return token.group(0) if token else None
    depth = 0
    for i in range(pos, len(text)):
        ch = text[i]
        # An escaped brace (\{ or \}) is literal text, not grouping.
        if ch == "{" and (i == 0 or text[i - 1] != "\\"):
            depth += 1
        elif ch == "}" and (i == 0 or text[i - 1] != "\\"):
            depth -= 1
            if depth == 0:
                content = text[pos + 1 : i].strip()
                return content or None
    return None


def strip_number_commas(text: str) -> str:
    """Remove thousands separators inside numbers: ``"1,000,000"`` -> ``"1000000"``; other commas stay."""
    return _THOUSANDS_RE.sub("", text)


def commas_dropped(pred: str, gold: str) -> tuple[str, str]:
    """``(pred, gold)`` with thousands commas removed from both when ``gold`` is a plain number ("1,250" and
    "1250" are the same answer), else unchanged: how the generic task and a task file's ``math`` grader
    read a number, in grading and in votes."""
    if _GOLD_NUMBER_RE.match(gold):
        return strip_number_commas(pred), strip_number_commas(gold)
    return pred, gold


def last_number(text: str) -> str | None:
    """The last number in ``text`` with thousands commas removed, or None if there is none. A fraction
    that ends where the last number ends is the number: ``"is 3/4."`` gives ``3/4``, not ``4``."""
    found = list(_NUMBER_RE.finditer(text))
    if not found:
        return None
    last = found[-1]
    fraction = next((m for m in _FRACTION_RE.finditer(text) if m.end() == last.end()), None)
    if fraction is not None:
        return fraction.group(0)
    return strip_number_commas(last.group(0))


def extract_answer(text: str, *, fallback_last_number: bool = False) -> str | None:
    """The final answer in a model response.

    The last ``\\boxed{}`` wins; with ``fallback_last_number`` (GSM8K) a response without any ``\\boxed``
    yields its last number instead. Returns None when no answer is found.
    """
    boxed = extract_boxed(text)
    if boxed is not None:
        return boxed
    if fallback_last_number and not _BOXED_RE.search(text):
        return last_number(text)
    return None


def _as_latex(answer: str) -> str:
    """Wrap a bare answer so math-verify's LaTeX extractor finds it."""
    s = answer.strip()
    if len(s) >= 2 and s.startswith("$") and s.endswith("$"):
        s = s.strip("$").strip()
    return "\\boxed{" + s + "}"


@functools.lru_cache(maxsize=4096)
def _parsed(answer: str) -> tuple[Any, ...]:
    """math-verify's parse of a bare answer, cached per grader subprocess: a problem's gold, and a vote's
    class representatives, are parsed once however many answers they are compared with (the parse is a
    pure function of the text and costs more than the comparison)."""
    from math_verify import parse  # imported lazily: only grader subprocesses need sympy

    return tuple(parse(_as_latex(answer), parsing_timeout=None))


def _verify(pred: str, gold: str) -> bool:
    """The math-verify comparison itself; runs inside a grader subprocess (no timeout of its own)."""
    from math_verify import verify

    gold_parsed, pred_parsed = _parsed(gold), _parsed(pred)
    if not gold_parsed or not pred_parsed:
        return False
    return bool(verify(list(gold_parsed), list(pred_parsed), timeout_seconds=None))


# --- out-of-process grading -------------------------------------------------------------------------------
# (see the module docstring for why a thread-based timeout is not enough)

#: How many grader subprocesses may exist at once; callers beyond that wait for an idle one.
MAX_GRADER_PROCESSES: int = max(1, min(4, os.cpu_count() or 1))
#: How long a new grader subprocess may take to import math-verify and report ready, in seconds.
STARTUP_TIMEOUT_S: float = 120.0

_WORKER_CODE = "from srd_worker.tasks.grading import _worker_main; _worker_main()"
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


def _worker_main() -> None:
    """Body of a grader subprocess: one JSON request per stdin line, one JSON reply per stdout line."""
    out = sys.stdout
    sys.stdout = sys.stderr  # anything printed by libraries must not corrupt the reply channel
    _verify("1", "2")  # import sympy and build the LaTeX parser before the first timed request
    out.write('{"ready": true}\n')
    out.flush()
    for line in sys.stdin:
        try:
            req = json.loads(line)
            reply: dict[str, object] = {"equal": _verify(req["pred"], req["gold"])}
        except Exception as exc:  # any grader failure means "not shown equal"; the parent logs it
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        out.write(json.dumps(reply) + "\n")
        out.flush()


class _GraderTimeout(Exception):
    pass


class _GraderProcess:
    """One grader subprocess and its pipes. Used by one thread at a time (it is checked out of the pool)."""

    def __init__(self) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
        env["PYTHONUNBUFFERED"] = "1"
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _WORKER_CODE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=None,
            env=env,
            close_fds=True,
        )
        self._buf = b""
        try:
            hello = self._read_line(time.monotonic() + STARTUP_TIMEOUT_S)
        except (_GraderTimeout, OSError) as exc:
            self.kill()
            raise ItemError(f"the grader subprocess did not start: {exc}") from exc
        if json.loads(hello).get("ready") is not True:  # pragma: no cover - defensive
            self.kill()
            raise ItemError(f"the grader subprocess sent an unexpected greeting: {hello!r}")

    def _read_line(self, deadline: float) -> str:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise _GraderTimeout("timed out")
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                raise OSError(f"grader subprocess exited (code {self.proc.poll()})")
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line.decode("utf-8")

    def compare(self, pred: str, gold: str, timeout_s: float) -> dict[str, object]:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps({"pred": pred, "gold": gold}) + "\n").encode("utf-8"))
        self.proc.stdin.flush()
        return json.loads(self._read_line(time.monotonic() + timeout_s))

    def kill(self) -> None:
        try:
            self.proc.kill()
            self.proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):  # pragma: no cover - already gone / unkillable
            pass
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:  # pragma: no cover
                pass


class _GraderPool:
    def __init__(self, size: int) -> None:
        self._size = size
        self._idle: list[_GraderProcess] = []
        self._count = 0
        self._cond = threading.Condition()

    def acquire(self) -> _GraderProcess:
        with self._cond:
            while True:
                while self._idle:
                    worker = self._idle.pop()
                    if worker.proc.poll() is None:
                        return worker
                    worker.kill()
                    self._count -= 1
                if self._count < self._size:
                    self._count += 1
                    break
                self._cond.wait()
        try:
            return _GraderProcess()
        except BaseException:
            with self._cond:
                self._count -= 1
                self._cond.notify()
            raise

    def release(self, worker: _GraderProcess) -> None:
        with self._cond:
            self._idle.append(worker)
            self._cond.notify()

    def discard(self, worker: _GraderProcess) -> None:
        worker.kill()
        with self._cond:
            self._count -= 1
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            idle, self._idle = self._idle, []
            self._count -= len(idle)
        for worker in idle:
            worker.kill()

    def forget(self) -> None:
        """In a forked child: drop the parent's graders (closing only this process's pipe copies)."""
        for worker in self._idle:
            for stream in (worker.proc.stdin, worker.proc.stdout):
                try:
                    if stream is not None:
                        stream.close()
                except OSError:  # pragma: no cover
                    pass
        self._idle = []


_pool = _GraderPool(MAX_GRADER_PROCESSES)


def shutdown_graders() -> None:
    """Stop the idle grader subprocesses (new ones start on demand). Also runs at interpreter exit."""
    _pool.close()


def _after_fork_in_child() -> None:
    # A forked process (e.g. a Celery prefork worker) must not talk to its parent's graders.
    global _pool
    _pool.forget()
    _pool = _GraderPool(MAX_GRADER_PROCESSES)


atexit.register(shutdown_graders)
os.register_at_fork(after_in_child=_after_fork_in_child)


def plain_number(text: str) -> Fraction | None:
    """The exact value of an answer that is a plain number (sign, decimals or a fraction ``a/b``; spaces
    around it allowed), else None."""
    m = _PLAIN_NUMBER_RE.fullmatch(text.strip())
    if m is None:
        return None
    try:
        return Fraction(m.group(0))
    except (ValueError, ZeroDivisionError):  # "1.5/2" (Fraction reads integer ratios only), "1/0"
        return None


def same_answer(answer: str, other: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> bool:
    """Whether two extracted answers are one answer, for votes: two plain numbers compare by exact value
    here (``18`` = ``18.00``, ``0.5`` = ``1/2``), with no grader subprocess, so a vote over n numeric
    answers costs no math-verify call; anything else is ``math_equal``."""
    a, b = plain_number(answer), plain_number(other)
    if a is not None and b is not None:
        return a == b
    return math_equal(answer, other, timeout_s=timeout_s)


def math_equal(pred: str, gold: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> bool:
    """True if the answer ``pred`` is mathematically equal to ``gold`` (math-verify), else False.

    Both are bare answers (no ``\\boxed``). Safe to call from any thread. The comparison runs in a grader
    subprocess; after ``timeout_s`` seconds of wall-clock time that subprocess is killed and the result is
    False (logged as a warning). Errors inside math-verify also count as not equal and are logged. Raises
    ``ItemError`` only if no grader subprocess can be started at all.
    """
    if pred.strip() == gold.strip():
        return True
    worker = _pool.acquire()
    try:
        reply = worker.compare(pred, gold, timeout_s)
    except _GraderTimeout:
        _pool.discard(worker)
        logger.warning(
            "math_equal timed out after %.1fs (graded as wrong): pred=%.200r gold=%.200r",
            timeout_s,
            pred,
            gold,
        )
        return False
    except (OSError, ValueError) as exc:  # the subprocess died (e.g. out of memory) or sent garbage
        _pool.discard(worker)
        logger.warning(
            "math_equal grader subprocess failed (graded as wrong): %s; pred=%.200r gold=%.200r",
            exc,
            pred,
            gold,
        )
        return False
    except BaseException:
        _pool.discard(worker)
        raise
    _pool.release(worker)
    if "error" in reply:
        logger.warning(
            "math_equal failed (graded as wrong): %s; pred=%.200r gold=%.200r", reply["error"], pred, gold
        )
        return False
    return reply.get("equal") is True


_TEXT_WRAPPER_RE = re.compile(
    r"\\(?:text|textbf|textit|textrm|textsf|texttt|mathrm|mathbf|mathit|mbox|emph)"
    r"\s*\{([^{}]*)\}"
)


def strip_latex_text(answer: str) -> str:
    """Plain text of a short boxed answer: ``\\text{Paris}`` -> ``Paris``, ``$B$`` -> ``B`` (non-math tasks)."""
    previous = None
    s = answer
    while previous != s:
        previous = s
        s = _TEXT_WRAPPER_RE.sub(r"\1", s)
    return s.replace("$", "").replace("\\ ", " ").replace("~", " ").strip()
