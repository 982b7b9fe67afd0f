"""Staged weight updates in vLLM: the new version streams into the shadow while
vLLM keeps generating; the commit runs between engine steps (docs/vllm.md,
"Staged updates in vLLM").

Two halves:

* ``StagedCommits`` (mixed into ``wsync.vllm_receiver.Receiver``, used with
  ``staged=True``), one per vLLM rank: the commit between engine steps, over
  ``wsync._staged_watch.StagedWatch``, which reads the rank's embedded-worker
  events and keeps what the rank serves, which version waits in the shadow and
  whether the rank is *unsafe*; the events the vLLM side sees (``staged``,
  ``commit``, ``committed``, ``rolled_back``, ``unsafe``).
* ``StagedEngine`` (the driver's side, e.g. the RL loop holding an ``LLM``):
  commits a version on every rank through ``collective_rpc("wsync_commit")``
  (vLLM runs it between two engine steps on every worker and steps again only
  once every worker returned), reads every rank's state and refuses to resume
  generation while a rank is unsafe or the ranks serve different versions.

Rules (docs/staging.md, "The owner's view"):
* The worker holds syncs off all the time except inside the commit: the live
  parameters are written only while a commit call runs, between engine steps.
* A rank is *unsafe* when its embedded worker stopped between ``STAGED`` and
  the outcome (it cannot tell whether the pool committed; exact, as the
  worker reports ``staged`` only once this process read ``STAGED``:
  docs/staging.md, "The owner's view"), or when its commit
  started (``COMMIT``) and did not end in ``COMMITTED`` (the copy may be
  partial). An unsafe rank serves nothing until its next ``COMMITTED``.
* A version rolled back on every rank leaves the engine whole on the version it
  served before.
"""
import time

from wsync import errors
from wsync._staged_watch import KINDS, StagedWatch  # noqa: F401 - KINDS: the event kinds

# ----------------------------------------------------------- driver side --
class StagedEngine:
    """The driver's handle on a vLLM engine whose ranks receive staged syncs
    through the worker extension (wsync.vllm_extension). `collective_rpc` is
    the engine's (``LLM.collective_rpc``, or a blocking wrapper of
    ``AsyncLLM.collective_rpc``): signature (method, timeout=None, args=(),
    kwargs=None) -> one result per rank. `pause` / `resume`: callables that
    pause and resume generation (e.g. ``llm.llm_engine.pause_generation`` /
    ``resume_generation``, or the API server's /pause and /resume); the
    engine calls `pause` when a rank turns unsafe or the ranks end on
    different versions, and refuses `resume` until every rank serves the
    same version safely."""

    def __init__(self, collective_rpc, *, pause=None, resume=None):
        self._rpc, self._pause, self._resume = collective_rpc, pause, resume
        self.blocked = None  # why generation must stay paused

    def status(self):
        """{served_version (None unless every rank serves one version safely),
        whole, staged_version (waiting on every rank, else None), unsafe:
        [rank: reason], blocked, ranks: every rank's Receiver.status()}."""
        ranks = self._rpc("wsync_status")
        return summarize(ranks, self.blocked)

    def commit(self, version, timeout=None, sync_id=""):
        """Commits `version` on every rank in one collective_rpc (between
        two engine steps). Returns the version the engine now serves. Raises
        Aborted when every rank rolled it back (the engine stays whole on
        what it served) and FailedPrecondition, after pausing generation,
        when the ranks did not end whole on one version."""
        results = self._rpc("wsync_commit", args=(int(version),),
                            kwargs={"timeout": timeout, "sync_id": sync_id})
        served = {r["serving_version"] for r in results}
        bad = [r for r in results if r["unsafe"]]
        if not bad and len(served) == 1:
            if all(r["ok"] for r in results):
                return served.pop()
            raise errors.Aborted(
                f"version {version} was not committed on any rank; the engine stays whole on "
                f"version {served.pop()}: " + "; ".join(r["error"] for r in results
                                                         if r["error"]))
        reason = ("ranks " + ", ".join(f"{r['membership']} on {r['serving_version']}"
                                       f"{' (unsafe: ' + r['unsafe'] + ')' if r['unsafe'] else ''}"
                                       for r in results)
                  + f" after the commit of version {version}")
        self._block(reason)
        raise errors.FailedPrecondition(
            f"the engine is not whole: {reason}; generation is paused until every rank "
            f"serves one version (sync version {version} again with resend=True, commit it, "
            "then resume)")

    def _block(self, reason):
        self.blocked = reason
        if self._pause is not None:
            self._pause()

    def resume(self):
        """Resumes generation if every rank serves one version safely;
        FailedPrecondition (naming the ranks) otherwise."""
        st = self.status()
        if not st["whole"]:
            raise errors.FailedPrecondition(
                "refusing to resume generation: "
                + ", ".join(f"{r['membership']} serves {r['weight_version']}"
                            + (f" (unsafe: {r['unsafe']})" if r["unsafe"] else "")
                            for r in st["ranks"]))
        self.blocked = None
        if self._resume is not None:
            self._resume()
        return st["served_version"]


def summarize(ranks, blocked=None):
    """The engine-wide view of its ranks' Receiver.status() dicts."""
    served = {r.get("serving_version", r["weight_version"]) or 0 for r in ranks}
    unsafe = {r["membership"]: r["unsafe"] for r in ranks if r.get("unsafe")}
    whole = len(served) == 1 and not unsafe and not any(r.get("committing") for r in ranks)
    staged = {r.get("staged_version") for r in ranks}
    return {"served_version": next(iter(served)) if whole else None, "whole": whole,
            "staged_version": staged.pop() if len(staged) == 1 else None,
            "unsafe": unsafe, "blocked": blocked, "ranks": list(ranks)}


# ------------------------------------------------------------ rank side --
class StagedCommits:
    """The staged half of wsync.vllm_receiver.Receiver (mixed in; used when
    it was made with ``staged=True``). The worker holds syncs off except
    inside ``commit``; ``begin`` / ``receive`` / ``finish`` keep the engine
    route's call order (start_weight_update, update_weights,
    finish_weight_update), ``receive`` being the commit."""

    _staged = None  # StagedWatch once started
    last_commit = None  # {version, admitted, committed, held, pause_s} of the last commit call

    def _staged_start(self):
        self._staged = StagedWatch(self.worker, self.membership, self.weight_version or 0)

    def restart(self):
        """Replaces a stopped (or failed) embedded worker by a new one with the
        same options and registers the live parameters again. An unsafe rank
        stays unsafe until its next COMMITTED (the trainer syncs the version
        again with ``resend=True`` and the engine commits it)."""
        if self.worker is not None and self.worker.running:
            return self  # alive: nothing to replace
        unsafe = self._staged.unsafe if self._staged is not None else None
        self.stop()
        self.worker, self._staged = None, None
        colocated, options = self._start_args
        self.start(self.controller, colocated=colocated, **options)
        if self._staged is not None:
            self._staged.unsafe = unsafe
        return self

    def _staged_begin(self):
        self._woke = self._wake()
        moved = self.moved()
        if moved:
            raise errors.FailedPrecondition(
                f"{self.membership}: parameters {moved[:5]} moved since registration "
                "(woken into new memory?): the destination no longer matches")
        self._window, self._received = True, None

    def commit(self, version, timeout=None, sync_id=""):
        """Commits the staged `version` (or a later staged one) into the live
        parameters, then post-processes and records it: call it between
        engine steps (vLLM's collective_rpc / update_weights run there).
        Waits up to `timeout` (default: the receiver's) for the version to be
        staged here and for its outcome. Returns the version served.
        Aborted: the pool rolled it back (the weights stay whole on the
        version served before). FailedPrecondition: the rank is unsafe.
        DeadlineExceeded: nothing staged in time (nothing written).
        `sync_id` (the trainer's ``handle.sync_id``): commit that sync (also
        a resend of a version this rank serves already)."""
        w = self._need_worker("commit")
        if self._staged is None:
            raise errors.FailedPrecondition(f"{self.membership}: commit() needs a receiver made "
                                            "with staged=True")
        timeout = self.timeout if timeout is None else float(timeout)
        since = time.monotonic()
        end = since + timeout
        with self._commit_lock:
            s = self._staged.wait_staged(int(version), end, since, sync_id)
            if s is None:  # already served (a repeated call)
                self.weight_version = self._received = self._staged.served
                return self.weight_version
            self._awake()
            self._quiesce()
            admitted = time.monotonic()
            w.admit()
            try:
                outcome = self._staged.wait_outcome(s, end)
            finally:
                began = self._hold_after_commit(s)
            if outcome is None and began:
                # The worker began this commit before the hold (it found no
                # hold in the same step that began it): the hold waited for
                # it, so its outcome is published; the watch reads it now.
                outcome = self._staged.wait_outcome(s, time.monotonic() + max(timeout, 5.0))
            held = time.monotonic()
            self.last_commit = {"version": s.version, "admitted": admitted, "held": held,
                                "pause_s": held - admitted, "outcome": outcome}
            if outcome == "committed":
                return self._committed(s.version)
            if outcome == "rolled_back":
                raise errors.Aborted(
                    f"{self.membership}: version {s.version} rolled back ({s.error}); the live "
                    f"weights stay whole on version {self._staged.served}",
                    group=self.group, rank=self.rank)
            if outcome is None:
                if self._staged.unsafe is None:
                    raise errors.DeadlineExceeded(
                        f"{self.membership}: version {s.version} staged but its commit did not "
                        f"begin within {timeout} s (nothing written; held again)",
                        group=self.group, rank=self.rank)
            raise errors.FailedPrecondition(f"{self.membership}: {self._staged.unsafe}",
                                            group=self.group, rank=self.rank)

    def _hold_after_commit(self, s):
        """Holds syncs off again after a commit call; returns the sync id of
        a commit that began since the admission (the hold waited for it to
        end: its outcome is published), "" if none began. A commit still writing after the
        worker's --hold_commit_wait makes the rank unsafe (never "nothing
        written")."""
        try:
            return self._hold() or ""
        except errors.DeadlineExceeded as e:
            with self._staged._cond:
                self._staged.unsafe = (f"the commit of version {s.version} began and still "
                                       f"writes the live weights: {e}")
            return ""

    def _awake(self):
        """The commit writes the live weights: wake them if vLLM's sleep mode
        put them to sleep (writing unmapped memory crashes the process, and a
        later wake would restore the old contents over the commit); refuse if
        they stay asleep or moved."""
        self._wake()
        moved = self.moved()
        if moved:
            raise errors.FailedPrecondition(
                f"{self.membership}: parameters {moved[:5]} moved since registration: "
                "refusing to commit into memory the worker no longer holds")

    def _quiesce(self):
        """No kernel of the last forward still reads the weights when the
        commit writes them: the commit runs between steps, but vLLM launches
        asynchronously."""
        if self.device is not None:
            import torch
            torch.cuda.synchronize(self.device)

    def _committed(self, version):
        try:
            self._post_process()
        except errors.WsyncError as e:
            self._staged.unsafe = (f"version {version} committed but its post-processing "
                                   f"failed: {e}")
            raise
        self.weight_version = self._received = version
        self._report("serving")
        return version

    def _staged_finish(self, w):
        if self._staged.unsafe is not None:
            raise errors.FailedPrecondition(
                f"{self.membership}: refusing to finish the update: {self._staged.unsafe}; "
                "this rank serves nothing until its next COMMITTED", group=self.group,
                rank=self.rank)
        if self._received is None:
            raise errors.FailedPrecondition(
                f"{self.membership}: finish without a committed version: call update_weights "
                "(the commit) with the version the trainer synced")
        self._window = False
        return self.weight_version

    def events(self):
        """A subscription to this rank's staged events from now on
        (``next(timeout)`` -> {kind: staged|commit|committed|rolled_back|
        unsafe, rank, version, sync_id, serving_version, error, unix_time,
        monotonic} or None; ``close()``)."""
        self._need_worker("events")
        return self._staged.subscribe()

    def on_event(self, callback):
        """Calls ``callback(event)`` (the dicts of ``events()``) for each
        staged event, on the receiver's event thread: keep it short."""
        self._need_worker("on_event")
        self._staged.on_event(callback)

    def _staged_status(self):
        st = self._staged.state() if self._staged is not None else {}
        return dict(st, staged=True, last_commit=self.last_commit,
                    history=list(self._staged.history) if self._staged is not None else [])
