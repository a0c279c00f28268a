"""What every fuzzer shares: the outcome of one case (success, a clean typed error, or a failure: an exception that
is not kleidipy's, or a hang cut off by a timer), the tally per outcome, and the case count (a size from the
environment, so a developer can run a longer fuzz by hand)."""

from __future__ import annotations

import os
import signal
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from kleidipy.errors import KleidipyError

#: seconds one case may take before it counts as a hang
CASE_TIMEOUT = 30.0


class Hang(BaseException):
    """Raised by the timer in a case that takes too long (a BaseException, so that no handler swallows it)."""


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise Hang in the main thread after ``seconds``."""

    def expire(signum: int, frame: object) -> None:
        raise Hang

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def outcome(case: Callable[[], object]) -> str:
    """``"ok"``, ``"error: <KleidipyError subclass>"``, or a failure: ``"TRACEBACK: <type>: <message>"`` or
    ``"HANG"``."""
    try:
        with time_limit(CASE_TIMEOUT):
            case()
    except Hang:
        return "HANG"
    except KleidipyError as exc:
        return f"error: {type(exc).__name__}"
    except Exception as exc:  # noqa: BLE001 - any other exception is what the fuzzer looks for
        return f"TRACEBACK: {type(exc).__name__}: {str(exc)[:200]}"
    return "ok"


def is_failure(result: str) -> bool:
    return result.startswith(("TRACEBACK", "HANG"))


def cases(env: str, default: int) -> int:
    """The number of cases: ``$<env>`` if set, else ``default``."""
    return int(os.environ.get(env, default))


@dataclass
class Tally:
    """Outcomes counted, and the first few failures with what made them."""

    counts: Counter = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)

    def add(self, result: str, what: str) -> None:
        self.counts["failure" if is_failure(result) else result] += 1
        if is_failure(result) and len(self.failures) < 20:
            self.failures.append(f"{what}: {result}")

    def report(self, title: str) -> str:
        width = max(map(len, self.counts), default=0)
        lines = [f"{title}: {sum(self.counts.values())} cases"]
        lines += [f"  {name:<{width}}  {n:>6}" for name, n in sorted(self.counts.items(), key=lambda kv: -kv[1])]
        return "\n".join(lines + [f"  FAILED {f}" for f in self.failures])
