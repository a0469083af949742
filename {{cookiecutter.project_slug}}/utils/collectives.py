"""Failures of ``torch.distributed`` collectives, said in one line: which rank gave up, on which collective, after how
long, against which timeout (:func:`collective`). ``distributed.py`` uses it around every collective it runs, and the
loop around the ones torch runs for it (DDP's gradient all-reduce in the backward)."""

from __future__ import annotations

import contextlib
import re
import time
from typing import Optional

import torch.distributed as dist

_timeout_s: Optional[float] = None  # the process group's timeout, for error messages


def remember_timeout(seconds: float) -> None:
    """The process group's collective timeout in seconds (``init_distributed`` sets it), named in timeout errors."""
    global _timeout_s
    _timeout_s = seconds


class CollectiveError(dist.DistBackendError):
    """A collective (all-reduce, all-gather, barrier, rendezvous) failed on this rank.

    A subclass of :class:`torch.distributed.DistBackendError`, so code that catches torch's error catches this one too.
    Attributes: ``rank`` (this process), ``collective`` (its name), ``timeout_s``.
    """

    def __init__(self, message: str, rank: int, collective: str, timeout_s: Optional[float]):
        super().__init__(message)
        self.rank, self.collective, self.timeout_s = rank, collective, timeout_s


class CollectiveTimeout(CollectiveError):
    """A collective waited longer than the process group's timeout: another rank hung or died.

    gloo raises a bare ``RuntimeError`` ("Timed out waiting 5000ms for recv operation") that names neither the rank nor
    the operation; this says which rank gave up, on which collective, after how long.
    """


@contextlib.contextmanager
def collective(name: str, rank: Optional[int] = None, timeout: Optional[tuple[str, float]] = None):
    """Turn a failure of the torch.distributed call(s) inside into a :class:`CollectiveError` (or
    :class:`CollectiveTimeout`) whose one-line message names this rank, the collective and the timeout (``timeout``: its
    name and seconds, default the process group's).

    Use it around collectives that torch runs for you, e.g. DDP's gradient all-reduce::

        with collective("gradient all-reduce (backward)"):
            loss.backward()

    Only errors of the communication are converted: torch's ``DistError`` family, and the bare ``RuntimeError`` gloo
    raises (recognised by its text: gloo, NCCL, timed out, connection closed or reset). Anything else (an out-of-memory
    error in that backward, a shape mismatch) passes unchanged.
    """
    start = time.monotonic()
    try:
        yield
    except CollectiveError:
        raise
    except RuntimeError as err:
        if not isinstance(err, dist.DistError) and not _COMMUNICATION_RE.search(str(err)):
            raise
        raise _collective_error(name, err, rank, time.monotonic() - start, timeout) from err


_COMMUNICATION_RE = re.compile(r"gloo|nccl|time[d ]?\s?out|connection (?:closed|reset|refused)|broken pipe",
                               re.IGNORECASE)


def _collective_error(name: str, err: RuntimeError, rank: Optional[int], elapsed: float,
                      timeout: Optional[tuple[str, float]] = None) -> CollectiveError:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()] or [type(err).__name__]
    reason = lines[0]
    initialized = dist.is_available() and dist.is_initialized()
    if rank is None:
        rank = dist.get_rank() if initialized else 0
    world = dist.get_world_size() if initialized else None
    others = f"the other {world - 1} rank(s)" if world else "the other ranks"
    label, seconds = timeout or ("process-group timeout", _timeout_s)
    after = f"{seconds:g} s" if seconds is not None else "the process group's timeout"
    # "timed out" in gloo's text is not always the group's timeout: a refused connect says it too, at once.
    waited_out = seconds is None or elapsed >= 0.8 * seconds
    if waited_out and re.search(r"time[d ]?\s?out", reason, re.IGNORECASE):
        return CollectiveTimeout(f"rank {rank}: {name} timed out after {elapsed:.0f} s waiting for {others} "
                                 f"({label} {after}): another rank hung or died before reaching it "
                                 f"({reason})", rank, name, seconds)
    return CollectiveError(f"rank {rank}: {name} failed after {elapsed:.1f} s (another rank may have died): "
                           f"{reason}", rank, name, seconds)
