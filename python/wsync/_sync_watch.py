"""Which syncs of an embedded worker ran inside an update window (private).

The embedded worker runs a sync whenever the controller sends one. A receiver that
must know whether a sync ran while its owner was ready for it (vLLM paused, weights
awake) opens a *window*; this watch reads the worker's sync events on its own thread
for the worker's whole life and classifies every sync by whether its "started" event
came while a window was open. Finished syncs of the open window are queued for the
receiver (``next``); a sync that did not start inside a window is *outside*: it is
queued too when it ends inside the window (marked ``inside: False``), and always
reported to ``on_outside(event)``.
"""
import threading
import time


class SyncWatch:
    def __init__(self, worker, on_outside):
        self._events = worker.events()
        self._on_outside = on_outside
        self._cond = threading.Condition()
        self._window = False
        self._in_window = set()  # sync ids started while the window was open
        self._inbox = []  # finished events while the window was open
        self._open_syncs = set()  # sync ids started in the window and not finished
        self.last_ok = 0  # highest version finished successfully
        self._stopping = False
        self._thread = threading.Thread(target=self._pump, name="wsync-sync-watch", daemon=True)
        self._thread.start()

    def _pump(self):
        while not self._stopping:
            e = self._events.next(0.2)
            if e is None:
                continue
            with self._cond:
                self._take(e)
                self._cond.notify_all()

    def _take(self, e):
        sid = e["sync_id"]
        if e["kind"] == "started":
            if self._window:
                self._in_window.add(sid)
                self._open_syncs.add(sid)
            return
        if e["kind"] != "finished":
            return  # a staged sync's steps (staged, commit, ...): its end is "finished"
        self._open_syncs.discard(sid)
        inside = sid in self._in_window
        if e["ok"]:
            self.last_ok = max(self.last_ok, int(e["version"]))
        if not inside:
            self._on_outside(e)
        if self._window:
            self._inbox.append(dict(e, inside=inside))

    def open(self):
        """Opens the window; returns the highest version finished before it."""
        with self._cond:
            self._window, self._in_window, self._inbox = True, set(), []
            self._open_syncs = set()
            return self.last_ok

    def close(self):
        with self._cond:
            self._window = False

    def next(self, index, deadline):
        """The window's `index`-th finished sync event, or None at `deadline`
        (time.monotonic())."""
        with self._cond:
            while len(self._inbox) <= index:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(min(left, 0.5))
            return self._inbox[index]

    def started_unfinished(self):
        """Whether a sync started in the window and has not ended."""
        with self._cond:
            return bool(self._open_syncs)

    def stop(self):
        self._stopping = True
        self._thread.join(5)
        self._events.close()
