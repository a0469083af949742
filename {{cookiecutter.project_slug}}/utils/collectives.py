"""Failures of ``torch.distributed`` collectives in one line: which rank gave up, on which collective, after how long,
against which timeout (:func:`collective`)."""

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
    """A collective (all-reduce, all-gather, barrier, rendezvous) failed on this rank; a ``DistBackendError``, so code
    that catches torch's error catches it too. Attributes: ``rank`` (this process), ``collective`` (its name),
    ``timeout_s``."""

    def __init__(self, message: str, rank: int, collective: str, timeout_s: Optional[float]):
        super().__init__(message)
        self.rank, self.collective, self.timeout_s = rank, collective, timeout_s


class CollectiveTimeout(CollectiveError):
    """A collective waited longer than the process group's timeout: another rank hung or died (where gloo's bare
    ``RuntimeError``, "Timed out waiting 5000ms for recv operation", names neither the rank nor the operation)."""


@contextlib.contextmanager
def collective(name: str, rank: Optional[int] = None, timeout: Optional[tuple[str, float]] = None):
    """Turn a communication failure inside (torch's ``DistError`` family, or gloo's bare ``RuntimeError`` recognised by
    its text) into one line naming this rank, the collective ``name`` and the timeout (``timeout``: its name and
    seconds, default the process group's); other errors (out of memory) pass unchanged. Also for collectives torch runs
    for you: ``with collective("gradient all-reduce (backward)"): loss.backward()``.

    Raises:
        CollectiveTimeout: the error says it timed out, after at least 80% of the timeout; CollectiveError: otherwise.
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
    reason = next((line.strip() for line in str(err).splitlines() if line.strip()), type(err).__name__)
    initialized = dist.is_available() and dist.is_initialized()
    rank = (dist.get_rank() if initialized else 0) if rank is None else rank
    world = dist.get_world_size() if initialized else None
    others = f"the other {world - 1} rank(s)" if world else "the other ranks"
    label, seconds = timeout or ("process-group timeout", _timeout_s)
    after = f"{seconds:g} s" if seconds is not None else "the process group's timeout"
    # "timed out" in gloo's text is not always the group's timeout: a refused connect says it too, at once.
    if (seconds is None or elapsed >= 0.8 * seconds) and re.search(r"time[d ]?\s?out", reason, re.IGNORECASE):
        message = (f"rank {rank}: {name} timed out after {elapsed:.0f} s waiting for {others} ({label} {after}): "
                   f"another rank hung or died before reaching it ({reason})")
        return CollectiveTimeout(message, rank, name, seconds)
    return CollectiveError(f"rank {rank}: {name} failed after {elapsed:.1f} s (another rank may have died): "
                           f"{reason}", rank, name, seconds)
