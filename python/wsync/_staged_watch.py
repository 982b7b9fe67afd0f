"""One vLLM rank's staged state, from its embedded worker's events (private;
used by wsync.vllm_staged.StagedCommits, docs/vllm.md "Staged updates in
vLLM"). ``StagedWatch`` reads the worker's events on its own thread for the
worker's whole life and keeps the version the live weights hold, the syncs
staged here and their outcomes, and whether the rank is *unsafe*; it turns
them into the events the vLLM side sees."""
import collections
import threading
import time

from wsync import errors

# The events the vLLM side sees (``Receiver.events()`` / ``on_event``).
KINDS = ("staged", "commit", "committed", "rolled_back", "unsafe")
HISTORY = 256  # events kept for status() and late subscribers
STALE_OUTCOME_S = 1.0  # an outcome older than the commit call counts after this
# The reason a stopping worker gives for rolling back a decided commit
# (worker/agent/agent_staged.cc): its own end, not the pool's outcome.
STOPPING = "the worker is stopping"


class _Sync:
    __slots__ = ("sync_id", "version", "staged", "commit", "outcome", "error", "at")

    def __init__(self, sync_id, version):
        self.sync_id, self.version = sync_id, version
        self.staged = self.commit = False
        self.outcome = self.error = None  # "committed" | "rolled_back" | "commit_failed"
        self.at = time.monotonic()  # when the last event of it arrived


class Subscription:
    """Events from the subscription on: ``next(timeout)`` gives one event dict
    or None; ``close()`` ends it."""

    def __init__(self, watch):
        self._watch, self._queue = watch, collections.deque()
        self._cond = threading.Condition()

    def _put(self, event):
        with self._cond:
            self._queue.append(event)
            self._cond.notify_all()

    def next(self, timeout=None):
        end = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while not self._queue:
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    return None
                self._cond.wait(left if left is not None else 0.5)
            return self._queue.popleft()

    def close(self):
        self._watch._unsubscribe(self)


class StagedWatch:
    """The staged state of one rank, from its embedded worker's events.
    ``membership`` names the rank in events and errors; ``served``: the
    version the live parameters hold at start."""

    def __init__(self, worker, membership, served=0):
        self.worker, self.membership = worker, membership
        self._events = worker.events()
        self._cond = threading.Condition()
        self._syncs = collections.OrderedDict()  # sync_id -> _Sync, newest last
        self.served = int(served)
        self.unsafe = None  # reason, while the rank must serve nothing
        self.history = collections.deque(maxlen=HISTORY)
        self._subs, self._callbacks = [], []
        self._stopping = False
        self._thread = threading.Thread(target=self._pump, name="wsync-staged-watch",
                                        daemon=True)
        self._thread.start()

    # ------------------------------------------------------------- events --
    def subscribe(self):
        sub = Subscription(self)
        with self._cond:
            self._subs.append(sub)
        return sub

    def _unsubscribe(self, sub):
        with self._cond:
            if sub in self._subs:
                self._subs.remove(sub)

    def on_event(self, callback):
        """Calls ``callback(event)`` on the watch's thread for every event."""
        with self._cond:
            self._callbacks.append(callback)

    def _emit(self, kind, s, error=None):
        event = {"kind": kind, "rank": self.membership, "version": s.version if s else None,
                 "sync_id": s.sync_id if s else "", "serving_version": self.served,
                 "error": error or "", "unix_time": time.time(),
                 "monotonic": time.monotonic()}
        self.history.append(event)
        for sub in list(self._subs):
            sub._put(event)
        return event

    def _pump(self):
        while not self._stopping:
            e = self._events.next(0.1)
            fired = []
            with self._cond:
                if e is not None:
                    fired = self._take(e)
                elif self._dead():
                    fired = self._mark_dead()
                self._cond.notify_all()
                callbacks = list(self._callbacks)
            for event in fired:
                for cb in callbacks:
                    try:
                        cb(event)
                    except Exception:  # noqa: BLE001 - a user callback never stops the watch
                        pass

    def _take(self, e):
        sid, kind = e["sync_id"], e["kind"]
        s = self._syncs.get(sid)
        if s is None:
            s = self._syncs[sid] = _Sync(sid, int(e["version"]))
            while len(self._syncs) > HISTORY:
                self._syncs.popitem(last=False)
        s.at = time.monotonic()
        if kind == "staged":
            s.staged = True
            return [self._emit("staged", s)]
        if kind == "commit":
            s.commit = True
            return [self._emit("commit", s)]
        if kind == "committed":
            s.outcome, self.served, self.unsafe = "committed", int(e["serving_version"]), None
            return [self._emit("committed", s)]
        if kind == "rolled_back":
            s.outcome, s.error = "rolled_back", e["error"]
            out = [self._emit("rolled_back", s, e["error"])]
            if STOPPING in e["error"]:  # not the pool's outcome: the worker is going
                s.outcome = "unknown"
                out += self._mark_dead(s)
            return out
        if kind != "finished" or s.outcome is not None:
            return []
        if e["ok"]:  # an in-place sync admitted inside a commit call: written whole
            s.outcome, self.served, self.unsafe = "committed", int(e["version"]), None
            return [self._emit("committed", s)]
        if s.commit:  # the commit began and failed: the live tensors are partly written
            s.outcome, s.error = "commit_failed", e["error"]
            self.unsafe = (f"the commit of version {s.version} failed after it began "
                           f"({e['error']}): the live weights are partly written")
            return [self._emit("unsafe", s, self.unsafe)]
        # Ended before any commit (failed before staging, refused while held):
        # nothing of it reached the live weights.
        s.outcome, s.error = "rolled_back", e["error"]
        return [self._emit("rolled_back", s, e["error"])]

    def _dead(self):
        return (self.unsafe is None and self.pending() is not None
                and not getattr(self.worker, "running", True))

    def _mark_dead(self, s=None):
        s = s or self.pending()
        self.unsafe = (f"the embedded worker stopped between STAGED of version {s.version} "
                       "and its outcome: whether the pool committed is unknown")
        s.outcome, s.error = "unknown", self.unsafe
        return [self._emit("unsafe", s, self.unsafe)]

    # -------------------------------------------------------------- state --
    def pending(self):
        """The newest sync staged here with no outcome yet, or None."""
        for s in reversed(self._syncs.values()):
            if s.staged and s.outcome is None:
                return s
        return None

    def state(self):
        """{served, staged_version, unsafe, committing}: under the lock."""
        with self._cond:
            if self._dead():
                self._mark_dead()
            p = self.pending()
            return {"serving_version": self.served, "unsafe": self.unsafe,
                    "staged_version": p.version if p is not None and not p.commit else None,
                    "committing": p is not None and p.commit}

    def wait_staged(self, version, end, since, sync_id=""):
        """The sync to commit for `version`: sync `sync_id` if given, else the
        newest sync of `version` or later that is staged here with no
        outcome. None if the rank already serves `version` or later (and,
        with `sync_id`, that sync committed). Raises Aborted when that sync
        rolled back (without `sync_id`, outcomes older than `since` count
        after STALE_OUTCOME_S, so that a new attempt can arrive),
        DeadlineExceeded at `end`."""
        with self._cond:
            while True:
                if sync_id:
                    latest = self._syncs.get(sync_id)
                    if latest is not None and latest.outcome == "committed":
                        return None
                else:
                    if self.served >= version and self.pending() is None:
                        return None
                    latest = next((s for s in reversed(self._syncs.values())
                                   if s.version >= version), None)
                now = time.monotonic()
                if latest is not None and latest.staged and latest.outcome is None:
                    return latest
                if latest is not None and latest.outcome not in (None, "committed") and (
                        sync_id or latest.at >= since or now - since >= STALE_OUTCOME_S):
                    if latest.outcome != "rolled_back":
                        raise errors.FailedPrecondition(f"{self.membership}: {self.unsafe}")
                    raise errors.Aborted(
                        f"{self.membership}: version {latest.version} was not committed here "
                        f"(rolled back: {latest.error}); the live weights stay whole on "
                        f"version {self.served}")
                if now >= end:
                    raise errors.DeadlineExceeded(
                        f"{self.membership}: no staged version {version} after the commit "
                        f"call's timeout (serving {self.served}; the trainer's sync must "
                        "stage on every rank first: wait for the pool's commit decision)")
                self._cond.wait(min(end - now, 0.2))

    def wait_outcome(self, s, end):
        """Waits for the outcome of staged sync `s` (admitted); returns it
        ("committed", "rolled_back", "commit_failed", "unknown") or None at
        `end`. A commit that began and has no outcome at `end` makes the rank
        unsafe."""
        with self._cond:
            while s.outcome is None:
                if self._dead():
                    self._mark_dead()
                    break
                left = end - time.monotonic()
                if left <= 0:
                    if s.commit:
                        self.unsafe = (f"the commit of version {s.version} began and did not "
                                       "end before the commit call's timeout")
                        self._emit("unsafe", s, self.unsafe)
                    return None
                self._cond.wait(min(left, 0.2))
            return s.outcome

    def stop(self):
        self._stopping = True
        self._thread.join(5)
        self._events.close()
