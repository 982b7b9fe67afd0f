"""Sync progress: a snapshot type and a one-line live display for terminals."""
import sys
import time
from dataclasses import dataclass

from wsync._proto import controller_pb2 as pb

PHASES = {pb.SYNC_RUNNING: "running", pb.SYNC_SUCCEEDED: "succeeded", pb.SYNC_FAILED: "failed",
          pb.SYNC_CANCELLED: "cancelled", pb.SYNC_PHASE_UNSPECIFIED: "unknown"}


@dataclass(frozen=True)
class Progress:
    """One look at a sync: bytes written into destinations, workers done, rate."""
    phase: str
    bytes_done: int
    bytes_total: int
    workers_done: int
    workers_total: int
    elapsed_seconds: float

    @property
    def fraction(self):
        return self.bytes_done / self.bytes_total if self.bytes_total else 1.0

    @property
    def gbps(self):
        """Destination GB (1e9 bytes) per second so far."""
        return self.bytes_done / self.elapsed_seconds / 1e9 if self.elapsed_seconds > 0 else 0.0

    @property
    def done(self):
        return self.phase != "running"

    @classmethod
    def from_status(cls, s):
        return cls(PHASES.get(s.phase, "unknown"), s.bytes_done, s.bytes_total, s.workers_done,
                   s.workers_total, s.elapsed_seconds)

    def line(self, label):
        return (f"{label}: {self.bytes_done / 1e9:8.3f} / {self.bytes_total / 1e9:.3f} GB "
                f"({100 * self.fraction:5.1f} %)  {self.gbps:7.2f} GB/s  "
                f"workers {self.workers_done}/{self.workers_total}  {self.phase}")


class Display:
    """Rewrites one line of `stream` per update (at most every `interval` s)."""

    def __init__(self, label, stream=None, interval=0.1):
        self.label = label
        self.stream = stream or sys.stderr
        self.interval = interval
        self._last = 0.0

    def update(self, progress, final=False):
        now = time.monotonic()
        if not final and now - self._last < self.interval:
            return
        self._last = now
        self.stream.write("\r" + progress.line(self.label) + ("\n" if final else ""))
        self.stream.flush()


def want_display(show):
    """`show` True/False, or None: only when stderr is a terminal."""
    if show is None:
        return sys.stderr.isatty()
    return bool(show)
