"""The control fast lane for asyncio (wsync.aio.Client(lane=)): Sync and
WaitSync over the controller's --lane_socket without blocking the event loop.
The frames, limits, listener check, fallbacks and errors are wsync._lane's;
only the waiting differs: the socket is non-blocking and a call that must
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


class AsyncLaneChannel:
    """As _lane.LaneChannel, with coroutine calls (one event loop)."""

    def __init__(self, path, token, where):
        self.path = path
        self._token = _lane.token_field(token)
        self._where = where
        self._busy = False
        self._sock = None
        self._pending = None  # (loop, fd, writable, future) of the wait in progress
        self._frames = _lane.Frames()
        self._next_id = 1
        self._retry_after = 0.0

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
        return None if resp is None else _lane.result_of(resp, entry[1], self._where)

    async def _call(self, tag, payload, timeout):
        deadline = time.monotonic() + timeout
        call_id = self._next_id
        self._next_id += 1
        frame = _lane.encode_request(call_id, self._token, tag, payload)
        if frame is None:
            _lane.warn(self.path, f"a request of {len(payload)} bytes is over the lane's limit "
                       f"of {_lane.MAX_REQUEST_BYTES} bytes", "this call goes over gRPC")
            return None
        try:
            for attempt in (0, 1):  # a connection the controller closed while idle: again
                if not self._connect():
                    return None
                try:
                    await self._send(frame, deadline)
                    break
                except (BrokenPipeError, ConnectionResetError) as e:
                    why = (_lane.read_refusal(self._sock, self._frames, self.path)
                           or f"lane {self.path}: send: {e.strerror}")
                    self.close()
                    if attempt == 1:
                        raise _lane.Refused(why) from None
            return await self._receive(call_id, deadline)
        except _lane.Refused as e:
            self.close()
            self._retry_after = time.monotonic() + _lane.RETRY_AFTER_S
            _lane.warn(self.path, e.args[0],
                       "calls go over gRPC (the lane is tried again in 10 s)")
            return None
        except ValueError as e:
            raise errors.from_status(_lane._UNAVAILABLE, f"lane {self.path}: {e}",
                                     self._where) from None

    def _connect(self):
        if self._sock is not None:
            return True
        if time.monotonic() < self._retry_after:
            return False
        self._sock, why = _lane.open_socket(self.path)  # non-blocking: never waits
        if self._sock is None:
            raise _lane.Refused(why)
        return True

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
            try:
                n = sock.recv_into(frames.free())
            except BlockingIOError:
                await self._wait(False, deadline)
                continue
            except OSError as e:
                raise ValueError(f"recv: {e.strerror or e}") from None
            if n == 0:
                raise ValueError("the controller closed the connection")
            frames.have += n
