"""The control fast lane in pure Python: the trainer's Sync and WaitSync over
the controller's --lane_socket (docs/performance-notes.md, "The control fast
lane"; its trust rules: docs/security.md), the same frames, limits and checks
as the C++ client (common/lane_client.h, common/lane_frame.h).

A frame is a 4-byte little-endian length, then a serialized LaneRequest
(proto/wsync/v1/lane.proto) towards the controller or a LaneResponse back.
A request is written with one send; answers are read into one reusable
buffer. One call at a time per connection: a call that finds the lane busy
(another thread's call) answers None and goes over gRPC, as the native
client does.

The channel answers None ("not carried: use gRPC") only when the call was
certainly not run by the controller: the lane is absent, its listener is not
trusted, the connection was refused or closed before the request was
written, the controller refused the connection (an answer with call_id 0),
or the request is over the lane's limit. Each of those warns
(RuntimeWarning); the lane is tried again RETRY_AFTER_S later. The
controller may also answer a call it did not start (LaneResponse.not_started:
its waits are full): None with a warning too, the connection kept and tried
at once for the next call. Otherwise, once a request is written, the call's
outcome is the lane's: the server's status
becomes the same wsync exception as over gRPC (errors.from_status), and a
connection lost mid-call raises Unavailable (the call may have run; a Sync
is never sent twice).
"""
import os
import select
import socket
import struct
import threading
import time
import warnings

from wsync import errors
from wsync.v1 import lane_pb2

HEADER_BYTES = 4
MAX_REQUEST_BYTES = 16 << 20  # kLaneMaxFrameBytes: the controller refuses more
MAX_RESPONSE_BYTES = 256 << 20  # kLaneMaxResponseBytes: an assignment's size
RETRY_AFTER_S = 10.0
# The calls the lane carries: method -> (the LaneRequest field's tag byte
# (field << 3 | length-delimited), the LaneResponse result field).
CALLS = {"Sync": (bytes([11 << 3 | 2]), "sync"), "WaitSync": (bytes([12 << 3 | 2]), "wait_sync")}

_DEADLINE_EXCEEDED = 4
_UNAVAILABLE = 14
_INITIAL_BUFFER = 64 << 10
_UCRED = struct.Struct("iII")  # struct ucred: pid, uid, gid
_LENGTH = struct.Struct("<I")


def varint(value):
    """`value` (>= 0) as a protobuf varint."""
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def token_field(token):
    """LaneRequest.token (field 2) as wire bytes; b"" for no token."""
    if not token:
        return b""
    raw = token.encode()
    return b"\x12" + varint(len(raw)) + raw


def encode_request(call_id, token_bytes, tag, payload):
    """The whole frame of a LaneRequest{call_id, token, <call> = payload}: the
    bytes LaneRequest.SerializeToString() gives, behind the length header
    (fields in number order, as protobuf writes them), without copying the
    request into a LaneRequest first. None when it is over
    MAX_REQUEST_BYTES."""
    length = varint(len(payload))
    body = 1 + len(varint(call_id)) + len(token_bytes) + len(tag) + len(length) + len(payload)
    if body > MAX_REQUEST_BYTES:
        return None
    return b"".join((_LENGTH.pack(body), b"\x08", varint(call_id), token_bytes, tag, length,
                     payload))


def untrusted_listener(path, ucred, euid=None):
    """None when the listener whose SO_PEERCRED is `ucred` (the raw struct
    ucred bytes) may receive this process's token: a process of this user
    (`euid`, default os.geteuid()) or of root. Otherwise the refusal, naming
    the path and both uids (the message common/lane_client.cc gives)."""
    euid = os.geteuid() if euid is None else euid
    if len(ucred) != _UCRED.size:
        return (f"lane: {path}: SO_PEERCRED gave {len(ucred)} bytes, not a struct ucred: "
                f"not trusted")
    _, uid, _ = _UCRED.unpack(ucred)
    if uid == euid or uid == 0:
        return None
    return (f"lane: {path} is served by uid {uid}, not by this user (uid {euid}) or root: "
            f"not trusted")


def open_socket(path):
    """A connected, non-blocking socket to a trusted listener at `path`, or
    (None, why) where it is absent, refuses or is not trusted."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.setblocking(False)  # a full backlog: EAGAIN, never a wait
        sock.connect(path)
        why = untrusted_listener(
            path, sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    except OSError as e:
        why = f"lane: cannot connect to {path}: {e.strerror or e}"
    if why is not None:
        sock.close()
        return None, why
    return sock, None


class Frames:
    """The answers read so far on one connection: a reusable buffer that
    grows only for an answer larger than it (up to MAX_RESPONSE_BYTES)."""

    def __init__(self):
        self.buf = bytearray(_INITIAL_BUFFER)
        self.view = memoryview(self.buf)
        self.have = 0

    def free(self):
        """The writable rest of the buffer (for recv_into)."""
        return self.view[self.have:]

    def take(self):
        """The next complete LaneResponse, None while incomplete. Raises
        ValueError for a header over the limit or a payload that is not a
        LaneResponse (the stream cannot be resynchronized: close it)."""
        if self.have < HEADER_BYTES:
            return None
        (size,) = _LENGTH.unpack_from(self.buf, 0)
        if size > MAX_RESPONSE_BYTES:
            raise ValueError(f"lane frame: the header announces {size} bytes, over the limit of "
                             f"{MAX_RESPONSE_BYTES} bytes (not a wsync lane peer?)")
        end = HEADER_BYTES + size
        if end > len(self.buf):
            self._grow(end)
        if self.have < end:
            return None
        try:
            resp = lane_pb2.LaneResponse.FromString(self.view[HEADER_BYTES:end])
        except Exception:  # google.protobuf.message.DecodeError and kin
            raise ValueError(f"lane frame: {size} bytes that are not a LaneResponse") from None
        rest = self.have - end
        if rest:
            self.buf[:rest] = self.buf[end:self.have]
        self.have = rest
        return resp

    def _grow(self, size):
        buf = bytearray(size)
        buf[:self.have] = self.view[:self.have]
        self.view.release()
        self.buf, self.view = buf, memoryview(buf)

    def clear(self):
        self.have = 0

    def fill(self, sock):
        """Reads what the non-blocking `sock` holds: False when nothing came
        yet (it would block). Raises ValueError when it failed or the
        controller closed it."""
        try:
            n = sock.recv_into(self.free())
        except BlockingIOError:
            return False
        except OSError as e:
            raise ValueError(f"recv: {e.strerror or e}") from None
        if n == 0:
            raise ValueError("the controller closed the connection")
        self.have += n
        return True


class Refused(Exception):
    """Internal: the call was not run; it goes over gRPC (args: why)."""


def check_answer(resp, call_id, path):
    """Raises Refused for the controller's refusal of the connection
    (call_id 0: nothing was run), ValueError for an answer to another call."""
    if resp.call_id == call_id:
        return
    if resp.call_id == 0:
        raise Refused(f"lane {path}: the controller refused the connection: {resp.message}")
    raise ValueError(f"response to call {resp.call_id} while waiting for call {call_id}")


def read_refusal(sock, frames, path):
    """After a failed send: the controller's refusal (call_id 0), if it
    wrote one before it closed the connection, as a message; else None."""
    try:
        n = sock.recv_into(frames.free())
        frames.have += n
        resp = frames.take()
    except (OSError, ValueError):
        return None
    if resp is None or resp.call_id != 0:
        return None
    return f"lane {path}: the controller refused the connection: {resp.message}"


def result_of(resp, field, where):
    """The call's response message, or its server status as the gRPC path's
    exception (CallSteps._result first turns a call the controller did not
    start into None)."""
    if resp.code != 0:
        raise errors.from_status(resp.code, resp.message, where)
    return getattr(resp, field)


def warn(path, why, what, stacklevel):
    """A RuntimeWarning; `stacklevel` as warnings.warn counts it from here."""
    warnings.warn(f"wsync: control lane {path}: {why}; {what}", RuntimeWarning,
                  stacklevel=stacklevel)


SEND, RECEIVE = "send", "receive"


def run_steps(steps, do):
    """Drives `steps` (a CallSteps._steps generator) with `do(step, arg,
    deadline)` doing each step's I/O (blocking); its result or exception goes
    back into the sequence. The sequence's return value."""
    reply, error = None, None
    while True:
        try:
            step = steps.send(reply) if error is None else steps.throw(error)
        except StopIteration as end:
            return end.value
        try:
            reply, error = do(*step), None
        except BaseException as e:  # the sequence decides; what it does not catch goes on
            reply, error = None, e


class CallSteps:
    """One lane call's sequence without its I/O, shared by LaneChannel and
    wsync._lane_aio.AsyncLaneChannel (which differ only in how they wait):
    the framing, the warning for a request over the limit, the one retry on
    a connection the controller closed while idle, and a refusal (the call
    was not run) turned into None with a warning and RETRY_AFTER_S. A
    subclass supplies _drop() and runs _steps() with its own I/O (run_steps
    for blocking calls): each step it yields, (SEND, frame, deadline) or
    (RECEIVE, call_id, deadline), is done by the caller, whose result (the
    LaneResponse of a RECEIVE) or exception is sent back in."""

    # The warnings' stacklevel: the client's method that called call()
    # (warn, _steps, run_steps, _call, call, it).
    _WARN_DEPTH = 6

    def __init__(self, path, token, where):
        self.path = path
        self._token = token_field(token)
        self._where = where
        self._sock = None
        self._frames = Frames()
        self._next_id = 1
        self._retry_after = 0.0

    def _steps(self, tag, payload, timeout):
        """Yields the steps of the call; returns its LaneResponse, None when
        it was not run."""
        deadline = time.monotonic() + timeout
        call_id = self._next_id
        self._next_id += 1
        frame = encode_request(call_id, self._token, tag, payload)
        if frame is None:
            warn(self.path, f"a request of {len(payload)} bytes is over the lane's limit of "
                 f"{MAX_REQUEST_BYTES} bytes", "this call goes over gRPC", self._WARN_DEPTH)
            return None
        try:
            for attempt in (0, 1):  # a connection the controller closed while idle: again
                if not self._connect():
                    return None
                try:
                    yield SEND, frame, deadline
                    break
                except (BrokenPipeError, ConnectionResetError) as e:
                    why = (read_refusal(self._sock, self._frames, self.path)
                           or f"lane {self.path}: send: {e.strerror}")
                    self._drop()
                    if attempt == 1:
                        raise Refused(why) from None
            return (yield RECEIVE, call_id, deadline)
        except Refused as e:
            self._drop()
            self._retry_after = time.monotonic() + RETRY_AFTER_S
            warn(self.path, e.args[0], "calls go over gRPC (the lane is tried again in 10 s)",
                 self._WARN_DEPTH)
            return None
        except ValueError as e:
            raise errors.from_status(_UNAVAILABLE, f"lane {self.path}: {e}", self._where) from None

    def _result(self, resp, field):
        """The call's response message; None, with a warning, when the
        controller did not start the call (LaneResponse.not_started: the
        lane's waits are full), which then goes over gRPC; else as
        result_of."""
        if resp.code != 0 and resp.not_started:
            # warn, _result, call, the client's method.
            warn(self.path, resp.message, "this call goes over gRPC", 4)
            return None
        return result_of(resp, field, self._where)

    def _connect(self):
        """True once connected; False while the lane is not to be tried
        again yet; raises Refused where it cannot connect."""
        if self._sock is not None:
            return True
        if time.monotonic() < self._retry_after:
            return False
        self._sock, why = open_socket(self.path)  # non-blocking: never waits
        if self._sock is None:
            raise Refused(why)
        return True


class LaneChannel(CallSteps):
    """Sync and WaitSync over the lane at `path` for wsync.Client (the
    pure-Python counterpart of wsync._native's lane). Thread-safe: one call
    at a time holds the connection; a concurrent one answers None."""

    def __init__(self, path, token, where):
        super().__init__(path, token, where)
        self._lock = threading.Lock()
        self._poll = None

    def close(self):
        """Closes the connection. A call in progress on another thread holds
        it: its socket is shut down first, so that call ends at once with
        Unavailable instead of close() waiting out its deadline."""
        if not self._lock.acquire(blocking=False):
            sock = self._sock
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass  # already closed by the call itself
            self._lock.acquire()
        try:
            self._drop()
        finally:
            self._lock.release()

    def call(self, method, request, timeout, spin=0.0):
        """The response message of TrainerService `method`, None when the
        lane does not carry it (not Sync / WaitSync, busy, absent, refused:
        use gRPC). `timeout` seconds bound the call (DeadlineExceeded; the
        connection is dropped); `spin`: seconds of polling the socket without
        sleeping first. Raises the gRPC path's exceptions."""
        entry = CALLS.get(method)
        if entry is None or not self._lock.acquire(blocking=False):
            return None
        try:
            resp = self._call(entry[0], request.SerializeToString(), timeout, spin)
        except BaseException:
            self._drop()  # an answer still due would come out of turn
            raise
        finally:
            self._lock.release()
        return None if resp is None else self._result(resp, entry[1])

    def _call(self, tag, payload, timeout, spin):
        """The LaneResponse of the call, None when it was not run."""
        spin_until = time.monotonic() + min(spin, timeout)

        def do(step, arg, deadline):
            if step is SEND:
                return self._send(arg, deadline)
            return self._receive(arg, deadline, spin_until)

        return run_steps(self._steps(tag, payload, timeout), do)

    def _drop(self):
        if self._sock is not None:
            self._sock.close()
        self._sock = self._poll = None
        self._frames.clear()

    def _send(self, frame, deadline):
        try:
            sent = self._sock.send(frame)  # a request fits the socket buffer: one call
        except BlockingIOError:
            sent = 0
        if sent == len(frame):
            return
        view, out = memoryview(frame), select.poll()
        out.register(self._sock.fileno(), select.POLLOUT)
        while sent < len(frame):
            left = deadline - time.monotonic()
            if left <= 0:
                raise errors.from_status(
                    _DEADLINE_EXCEEDED,
                    f"lane {self.path}: the controller did not take the request in time")
            out.poll(min(1000, int(left * 1000) + 1))
            try:
                sent += self._sock.send(view[sent:])
            except BlockingIOError:
                pass

    def _receive(self, call_id, deadline, spin_until):
        frames, sock = self._frames, self._sock
        if self._poll is None:
            self._poll = select.poll()
            self._poll.register(sock.fileno(), select.POLLIN)
        while True:
            resp = frames.take()
            if resp is not None:
                check_answer(resp, call_id, self.path)
                return resp
            if frames.fill(sock):
                continue
            now = time.monotonic()
            if now >= deadline:
                raise errors.from_status(_DEADLINE_EXCEEDED, "Deadline Exceeded")
            if now < spin_until:
                os.sched_yield()  # releases the GIL
            else:
                self._poll.poll(min(1000, int((deadline - now) * 1000) + 1))
