"""The owners' side of staged syncs in the Python tests: each receiver's
SyncEvents, followed in a thread opened before the sync starts."""
import threading
import time

import wsync.torch
from wsync._proto import worker_local_pb2 as lpb


def follow(socket, events, subscribed, until_version):
    """Appends the events of `socket` to `events` until FINISHED of
    `until_version` (or the stream's 60 s)."""
    subscribed.set()
    for ev in wsync.torch.sync_events(socket, timeout=60):
        events.append(ev)
        if ev.kind == lpb.SyncEvent.FINISHED and ev.version == until_version:
            return


def follow_receivers(receivers, until_version):
    """One follower per receiver (wsync.torch.register's result): returns
    (events per receiver, threads) once every stream is open."""
    events, threads = [[] for _ in receivers], []
    for reg, out in zip(receivers, events):
        subscribed = threading.Event()
        t = threading.Thread(target=follow, args=(reg.socket, out, subscribed, until_version))
        t.start()
        subscribed.wait(5)
        threads.append(t)
    time.sleep(0.3)  # the event streams are open before the sync starts
    return events, threads
