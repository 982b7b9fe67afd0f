"""The control fast lane for asyncio (wsync.aio.Client(lane=)): Sync and
WaitSync over the controller's --lane_socket without blocking the event loop.
The frames, limits, listener check, fallbacks and errors are wsync._lane's
(the call's sequence is _lane.CallSteps, run here with awaits); only the
waiting differs: the socket is non-blocking and a call that must
wait for its answer awaits the loop's readiness callback (add_reader), with
the call's deadline as a timer. One call at a time per connection: a call
that finds the lane busy (another coroutine's call in flight) answers None
and goes over gRPC. A cancelled call drops the connection (its answer would
come out of turn), as a deadline does; the sync itself goes on.
"""
import asyncio
import time

from wsync import _lane, errors


def _wake(fut):
    if not fut.done():
        fut.set_result(None)


class AsyncLaneChannel(_lane.CallSteps):
    """As _lane.LaneChannel, with coroutine calls (one event loop)."""

    _WARN_DEPTH = 5  # warn, _steps, _call, call, the client's method

    def __init__(self, path, token, where):
        super().__init__(path, token, where)
        self._busy = False
        self._pending = None  # (loop, fd, writable, future) of the wait in progress

    def close(self):
        """Closes the connection; a call waiting on it ends at once with
        Unavailable (its reader or writer is removed first: the descriptor
        number may be reused once closed)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            loop, fd, writable, fut = pending
            (loop.remove_writer if writable else loop.remove_reader)(fd)
            if not fut.done():
                fut.set_exception(errors.from_status(
                    _lane._UNAVAILABLE, f"lane {self.path}: the client was closed", self._where))
        if self._sock is not None:
            self._sock.close()
        self._sock = None
        self._frames.clear()

    async def call(self, method, request, timeout):
        """The response message of TrainerService `method`, None when the
        lane does not carry it (use gRPC); raises the gRPC path's exceptions.
        `timeout` seconds bound the call (DeadlineExceeded)."""
        entry = _lane.CALLS.get(method)
        if entry is None or self._busy:
            return None
        self._busy = True
        try:
            resp = await self._call(entry[0], request.SerializeToString(), timeout)
        except BaseException:  # CancelledError included
            self.close()
            raise
        finally:
            self._busy = False
        return None if resp is None else self._result(resp, entry[1])

    async def _call(self, tag, payload, timeout):
        """The LaneResponse of the call, None when it was not run (as
        _lane.run_steps, awaiting each step)."""
        steps = self._steps(tag, payload, timeout)
        reply, error = None, None
        while True:
            try:
                step, arg, deadline = steps.send(reply) if error is None else steps.throw(error)
            except StopIteration as end:
                return end.value
            try:
                if step is _lane.SEND:
                    reply, error = await self._send(arg, deadline), None
                else:
                    reply, error = await self._receive(arg, deadline), None
            except BaseException as e:  # CancelledError too: the sequence lets it through
                reply, error = None, e

    def _drop(self):
        self.close()

    async def _wait(self, writable, deadline):
        """Until the socket is readable (writable) or `deadline` passed."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise errors.from_status(_lane._DEADLINE_EXCEEDED, "Deadline Exceeded")
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        fd = self._sock.fileno()
        (loop.add_writer if writable else loop.add_reader)(fd, _wake, fut)
        self._pending = (loop, fd, writable, fut)
        timer = loop.call_later(left, _wake, fut)
        try:
            await fut
        finally:
            timer.cancel()
            if self._pending is not None and self._pending[3] is fut:  # close() did it otherwise
                self._pending = None
                (loop.remove_writer if writable else loop.remove_reader)(fd)

    async def _send(self, frame, deadline):
        sent, view = 0, memoryview(frame)
        while True:
            try:
                sent += self._sock.send(view[sent:] if sent else frame)
            except BlockingIOError:
                pass
            if sent == len(frame):
                return
            await self._wait(True, deadline)

    async def _receive(self, call_id, deadline):
        frames, sock = self._frames, self._sock
        while True:
            resp = frames.take()
            if resp is not None:
                _lane.check_answer(resp, call_id, self.path)
                return resp
            if not frames.fill(sock):
                await self._wait(False, deadline)
