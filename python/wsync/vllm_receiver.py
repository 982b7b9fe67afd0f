"""One vLLM rank receiving weights through wsync: the core behind both vLLM routes.

    rx = Receiver(model, tp_rank=r, tp_size=tp, dp_rank=d, dp_size=dp, sleep=...)
    rx.start(controller)      # embedded worker inference:<d*tp+r>:<dp*tp>, live params registered
    # per version, while vLLM's generation is paused:
    rx.begin()                # wake the weights if asleep, open the update window
    rx.receive(version)       # wait until wsync wrote `version` into the live parameters
    rx.finish()               # post-process if needed, record the version
    rx.stop()

Used by ``wsync.vllm_engine`` (vLLM's WeightTransferEngine, backend "wsync") and
``wsync.vllm_extension`` (``--worker-extension-cls``); both are thin adapters.

Contracts:
* The destination is derived from the live model (``wsync.vllm_live``) and every
  parameter is registered where it lives (by pointer, no copy): the trainer's sync
  writes straight into vLLM's parameter storage, so CUDA graphs stay valid.
* The writes are driven by the controller (the trainer's ``wsync.Client.sync``), not by
  this object: it opens a window (``begin``), waits for the version (``receive``) and
  closes it (``finish``). vLLM's generation must be paused around the window (the
  engine core's pause / resume; docs/vllm.md).
* Sleep mode: ``begin`` wakes the weights first when ``sleep.asleep()`` says they are
  asleep (writing into unmapped sleep-mode memory crashes the process); it refuses to
  open the window if they stay asleep.
* Windows: the worker's sync events are read for its whole life (wsync._sync_watch);
  a sync counts for ``receive`` if it started inside the window, or, having started
  before, if ``begin`` did not wake the weights since. Others are reported in
  ``status()["outside_window"]``.
* Failure: a failed sync may have written part of the version into the live
  parameters. The receiver then holds *mixed* weights: ``receive`` retries (waits for
  the trainer's next attempt at the same version) up to ``retries`` times, then raises
  ``wsync.errors.Aborted`` naming the version and the failed rank; ``finish`` refuses
  (``FailedPrecondition``) until a later sync succeeds. ``status()["mixed"]`` says so.
  Generation must stay paused while mixed.
* Post-processing: ``process_weights_after_loading`` of a layer's quantization method
  runs after each version only where the wire format is not the final one
  (``postprocess``: "auto" = modules whose quant_method is not vLLM's Unquantized*
  method; "never"; "always"). It must work in place: a post-processing step that moved
  a registered parameter's storage is an error naming the parameters.
* Staged (``staged=True``, wsync.vllm_staged): the worker holds syncs off except
  inside ``commit`` (which ``receive`` is): the version stages into the shadow while
  vLLM generates, the commit and post-processing run inside one call between engine
  steps; ``status()`` tells the served and the staged version and whether the rank
  is unsafe (docs/vllm.md, "Staged updates in vLLM").
"""
import threading
import time

from wsync import embedded, errors, vllm_live
from wsync._sync_watch import SyncWatch
from wsync.errors import _parse_member
from wsync._vllm_sleep import CuMemSleep  # noqa: F401 - part of this module's API
from wsync.vllm_staged import StagedCommits

POSTPROCESS = ("auto", "never", "always")


def _ranks_from_model(model):
    """(tp_rank, tp_size, ep_rank, ep_size) as the model's vLLM layers hold them:
    the tensor-parallel layers (tp_size > 1) must agree; FusedMoE gives ep."""
    tp, ep = {}, {}
    for name, m in model.named_modules():
        if getattr(m, "disable_tp", False) or not hasattr(m, "tp_rank"):
            continue
        if int(getattr(m, "tp_size", 1)) > 1:
            tp.setdefault((int(m.tp_rank), int(m.tp_size)), name)
        if int(getattr(m, "ep_size", 1)) > 1:
            ep.setdefault((int(getattr(m, "ep_rank", 0)), int(m.ep_size)), name)
    for what, seen in (("tensor", tp), ("expert", ep)):
        if len(seen) > 1:
            raise errors.InvalidArgument(
                f"the model's layers disagree on the {what}-parallel (rank, size): "
                + ", ".join(f"{n} says {k}" for k, n in seen.items()))
    (tp_rank, tp_size), = tp or {(0, 1): ""}
    (ep_rank, ep_size), = ep or {(0, 1): ""}
    return tp_rank, tp_size, ep_rank, ep_size


class Receiver(StagedCommits):
    """The receiving side of one vLLM rank (see the module docstring).

    ``sleep``: None (no sleep mode) or an object with ``asleep()`` -> bool and
    ``wake_up()``. ``timeout``: seconds ``receive`` waits for a version.
    ``retries``: failed attempts at a version ``receive`` waits through.
    ``staged``: the trainer defines the transfer staged (docs/vllm.md,
    "Staged updates in vLLM"): the worker holds syncs off except inside
    ``commit`` (= ``receive``), so vLLM keeps generating while the version
    streams into the shadow; wsync.vllm_staged.StagedCommits."""

    def __init__(self, model, *, tp_rank, tp_size, ep_rank=0, ep_size=1, dp_rank=0, dp_size=1,
                 group="inference", hf_config=None, experts="separate", skip=(), device=None,
                 sleep=None, postprocess="auto", timeout=300.0, retries=0,
                 hold_outside_window=True, staged=False):
        if postprocess not in POSTPROCESS:
            raise errors.InvalidArgument(f"postprocess {postprocess!r}: expected one of "
                                         f"{', '.join(POSTPROCESS)}")
        if dp_size > 1 and ep_size > 1:
            raise errors.InvalidArgument(
                f"expert parallelism across {dp_size} data-parallel replicas is not supported "
                f"(ep_size {ep_size}): the destination is derived per tensor-parallel group")
        if not 0 <= dp_rank < dp_size:
            raise errors.InvalidArgument(f"data-parallel rank {dp_rank} of {dp_size}")
        self.model, self.device, self.sleep = model, device, sleep
        self.group, self.postprocess = group, postprocess
        self.timeout, self.retries = float(timeout), int(retries)
        self.staged = bool(staged)
        self.hold_outside_window = bool(hold_outside_window) or self.staged
        self._commit_lock = threading.Lock()
        self.tp_rank, self.tp_size = tp_rank, tp_size
        self.dp_rank = dp_rank
        self.rank, self.size = dp_rank * tp_size + tp_rank, dp_size * tp_size
        self.live = vllm_live.destination_from_model(
            model, tp_rank=tp_rank, tp_size=tp_size, ep_rank=ep_rank, ep_size=ep_size,
            hf_config=hf_config, experts=experts, rank=self.rank, skip=skip, name=group)
        self.worker = self.controller = None
        self.weight_version = None  # the version these weights are, once finished
        self._lock = threading.Lock()
        self._watch = None  # SyncWatch of the worker's sync events
        self._window = False
        self._woke = False  # the open window woke the weights from sleep
        self._done_at_begin = 0  # the highest version done when the window opened
        self._received = None  # version received in the open window
        self._mixed = None  # (version, failed group, failed rank, error) while mixed
        self.outside_window = []  # versions synced while no window was open
        self.post_processed = []  # modules post-processed after the last version

    # ------------------------------------------------------------ lifecycle --
    @property
    def membership(self):
        return f"{self.group}:{self.rank}:{self.size}"

    def start(self, controller, colocated=None, **worker_options):
        """Starts this rank's embedded worker and registers every live
        parameter. `colocated` (WsyncInitInfo.colocated, see colocation()):
        the worker also holds the trainer rank of this GPU and serves the
        local API where that trainer registers its tensors."""
        if self.worker is not None:
            raise errors.FailedPrecondition(f"{self.membership}: the embedded worker is "
                                            "already running")
        self._start_args = (colocated, dict(worker_options))
        extra_groups, socket = colocation(colocated, self.rank)
        if socket is not None:
            worker_options = dict(worker_options, local_socket=socket)
        self.controller = controller
        self.worker = embedded.Worker(controller, ",".join([self.membership, *extra_groups]),
                                      device=self.device, **worker_options)
        try:
            self.worker.register(self.live.buffers, group=self.group)
        except errors.WsyncError:
            self.worker.stop()
            self.worker = None
            raise
        if self.staged:
            self._staged_start()
        else:
            self._watch = SyncWatch(self.worker, self._outside)
        self._hold()
        self._report("serving")  # the weights vLLM loaded: version 0 until a sync
        return self

    def _hold(self):
        """Outside an update window the worker refuses syncs before touching
        the weights (vLLM may be generating from them, or they may be asleep:
        writing asleep weights crashes vLLM)."""
        if self.hold_outside_window:
            return self.worker.hold(
                f"{self.membership} serves from these weights (vLLM generates): the commit "
                "waits for update_weights / wsync_commit" if self.staged else
                f"{self.membership} is not in a weight update (vLLM serves from these "
                "weights); call start_weight_update on every rank before the trainer syncs")

    def _report(self, state):
        """Tells the controller (through the worker) which version this rank
        serves and in what state; one vLLM server (data-parallel replica
        `dp<i>`, its tp ranks) is one replica. Best effort: a failed report
        never fails the update, the next one (or the heartbeat) carries it."""
        try:
            self.worker.set_serving(self.weight_version or 0, state, group=self.group,
                                    replica=f"dp{self.dp_rank}", replica_ranks=self.tp_size)
        except (errors.WsyncError, AttributeError):
            pass

    def stop(self):
        if self._watch is not None:
            self._watch.stop()
            self._watch = None
        if self._staged is not None:
            self._staged.stop()
        if self.worker is not None:
            self.worker.stop()

    def _need_worker(self, what):
        if self.worker is None:
            raise errors.FailedPrecondition(f"{self.membership}: {what} before start(): "
                                            "initialize the transfer engine first")
        return self.worker

    # ---------------------------------------------------------- the window --
    def begin(self):
        """Opens the update window: wakes the weights if asleep. vLLM's
        generation must be paused already, and the trainer syncs only after
        this returned on every rank."""
        self._need_worker("begin")
        with self._lock:
            if self._window:
                raise errors.FailedPrecondition(
                    f"{self.membership}: a weight update is already open (received "
                    f"{self._received}); finish it first")
            if self.staged:
                return self._staged_begin()
            self._woke = self._wake()
            moved = self.moved()
            if moved:
                raise errors.FailedPrecondition(
                    f"{self.membership}: parameters {moved[:5]} moved since registration "
                    "(woken into new memory?): the destination no longer matches")
            self._done_at_begin = self._watch.open()
            self._window, self._received = True, None
            self.worker.admit()
            self._report("updating")

    def _wake(self):
        """Wakes asleep weights; True if they were asleep."""
        if self.sleep is None or not self.sleep.asleep():
            return False
        self.sleep.wake_up()
        if self.sleep.asleep():
            raise errors.FailedPrecondition(
                f"{self.membership}: the weights are still asleep after wake_up: refusing to "
                "update asleep weights")
        return True

    def _outside(self, e):
        """A sync that did not start in an update window (generation was not
        paused): reported in ``outside_window``; a failed one leaves the weights
        mixed, a successful one (a full rewrite) ends a mixed state; one the
        held worker refused (``untouched``) changed nothing."""
        self.outside_window.append(int(e["version"]))
        if e.get("untouched"):
            return  # refused while held: nothing was written
        if not e["ok"]:
            self._mixed = self._mixed or (int(e["version"]), "", -1, "it did not start in an "
                                          f"update window: {e['error']}")
        elif not self._window:
            self._mixed = None

    def _mixed_text(self):
        v, group, rank, error = self._mixed
        return (f"the sync of version {v} failed" + (f" at {group}/{rank}" if group else "")
                + f" ({error}); the live weights are mixed (version {self.weight_version} "
                "partly overwritten)")

    def receive(self, version, timeout=None):
        """Waits until the worker finished `version` (or a later one) into the
        live parameters. On a failed attempt: waits for up to ``retries``
        further attempts, then raises Aborted naming the version and the
        failed rank (the weights are mixed). DeadlineExceeded after `timeout`.
        A sync that began before the window opened counts only if the weights
        were not woken since (waking restored the pre-sleep contents)."""
        if not self._window:
            raise errors.FailedPrecondition(
                f"{self.membership}: receive({version}) without begin(): pause generation "
                "and start the weight update first")
        if self.staged:
            return self.commit(version, timeout)
        timeout = self.timeout if timeout is None else float(timeout)
        end = time.monotonic() + timeout
        if self._mixed is None and self._done_at_begin >= version:
            return self._early(self._done_at_begin, ok=True)
        failures, index = 0, 0
        while True:
            e = self._watch.next(index, end)
            if e is None:
                break
            index += 1
            if e["version"] < version:
                continue
            if not e["inside"]:
                return self._early(int(e["version"]), e["ok"])
            if e["ok"]:
                return self._received_version(int(e["version"]))
            group, rank, error = self._first_cause(e)
            self._mixed = (int(e["version"]), group, rank, error)
            self._report("failed")
            failures += 1
            if failures > self.retries:
                raise errors.Aborted(
                    f"{self.membership}: {self._mixed_text()}: generation must stay paused "
                    "until a sync of this version succeeds", group=group, rank=rank)
        started = self._watch.started_unfinished()
        if started:
            self._mixed = (version, "", -1, f"started, no end after {timeout} s")
        raise errors.DeadlineExceeded(
            f"{self.membership}: version {version} not received after {timeout} s (a sync "
            f"{'started' if started else 'never started'}; worker status "
            f"{self.worker.status()})", group=self.group, rank=self.rank)

    def _early(self, version, ok):
        """A sync of `version` that began before this window opened: the trainer
        synced before start_weight_update (reported in ``outside_window``).
        Accepted if it succeeded and the weights were not woken since."""
        if ok and not self._woke:
            return self._received_version(version)
        why = ("failed" if not ok else "was written before begin() woke the weights from "
               "sleep (waking restored the pre-sleep contents)")
        self._mixed = (version, "", -1, f"it began before the update window opened and {why}")
        raise errors.Aborted(
            f"{self.membership}: {self._mixed_text()}: start the weight update on every rank "
            "before the trainer syncs, then sync a new version", group=self.group,
            rank=self.rank)

    def _first_cause(self, event, wait_s=3.0):
        """(failed group, rank, error) of a failed sync: the controller's first
        cause (it names the rank that failed, e.g. a trainer rank that died),
        else what this worker saw."""
        try:
            from wsync.client import Client
            from wsync._proto import controller_pb2 as pb
            with Client(self.controller, timeout=wait_s + 2) as c:
                st = c._rpc("WaitSync", pb.WaitSyncRequest(sync_id=event["sync_id"],
                                                           timeout_ms=int(wait_s * 1000)))
            if st.phase != pb.SYNC_RUNNING and st.failed_group:
                return st.failed_group, int(st.failed_rank), st.error
        except (errors.WsyncError, ImportError):
            pass
        group, rank = _parse_member(event["error"] or "")
        return group, rank, event["error"]

    def _received_version(self, version):
        self._received, self._mixed = version, None
        return version

    def finish(self):
        """Closes the window: post-processes (where the wire format is not
        final) and records the version. Refuses while the weights are mixed
        or when nothing was received. Returns the version now served."""
        w = self._need_worker("finish")
        with self._lock:
            if not self._window:
                raise errors.FailedPrecondition(f"{self.membership}: finish without begin")
            if self.staged:
                return self._staged_finish(w)
            if self._mixed is not None:
                raise errors.FailedPrecondition(
                    f"{self.membership}: refusing to finish the update: {self._mixed_text()}; "
                    "keep generation paused and sync the version again",
                    group=self._mixed[1], rank=self._mixed[2])
            if self._received is None:
                raise errors.FailedPrecondition(
                    f"{self.membership}: finish without a received version: call receive "
                    "(vLLM's update_weights) with the version the trainer synced")
            self._post_process()
            self.weight_version = self._received
            self._close(w)
            self._report("serving")
            return self.weight_version

    def abort(self):
        """Closes the window without recording a version (a failed update)."""
        with self._lock:
            if self._window and self.staged:
                self._window = False  # held all along: nothing to undo
            elif self._window:
                self._close(self.worker)
                self._report("failed" if self._mixed is not None else "paused")

    def _close(self, w):
        self._hold()
        self._window = False
        self._watch.close()

    # ------------------------------------------------------- post-process --
    def _post_process(self):
        if self.postprocess == "never":
            return
        ran = []
        for name, m in self.model.named_modules():
            qm = getattr(m, "quant_method", None)
            fn = getattr(qm, "process_weights_after_loading", None)
            if fn is None:
                continue
            if self.postprocess == "auto" and type(qm).__name__.startswith("Unquantized"):
                continue
            fn(m)
            ran.append(name)
        moved = self.moved()
        if moved:
            raise errors.FailedPrecondition(
                f"{self.membership}: process_weights_after_loading of {ran[:5]} moved "
                f"parameters {moved[:5]}: wsync writes into the registered storage, so the "
                "post-processing must work in place (or set postprocess='never' and send the "
                "final format)")
        self.post_processed = ran

    def moved(self):
        """Registered parameters that are no longer where the model holds them:
        replaced in the module (``layer.weight = Parameter(...)``), reallocated
        (``param.data = ...``) or gone."""
        now = dict(self.model.named_parameters())
        out = []
        for name, t in self.live.buffers.items():
            p = now.get(name)
            if p is None or p.data_ptr() != t.data_ptr() or p.shape != t.shape:
                out.append(name)
        return out + [n for n in (self.worker.stale() if self.worker else []) if n not in out]

    # --------------------------------------------------------------- status --
    def status(self):
        """{membership, weight_version, window_open, received, mixed,
        outside_window, worker: the embedded worker's status}."""
        mixed = None
        if self._mixed is not None:
            v, g, r, e = self._mixed
            mixed = {"version": v, "failed_group": g, "failed_rank": r, "error": e}
        out = {"membership": self.membership, "weight_version": self.weight_version,
               "window_open": self._window, "received": self._received, "mixed": mixed,
               "outside_window": list(self.outside_window), "staged": False,
               "worker": self.worker.status() if self.worker is not None else None}
        return dict(out, **self._staged_status()) if self.staged else out


def receiver_for(model, *, parallel_config=None, dp_rank=None, **options):
    """A Receiver for a vLLM model, its ranks read from the model's own layers
    (tp_rank / tp_size of its parallel linear layers, ep of FusedMoE) and the
    data-parallel replica from vLLM's ParallelConfig, cross-checked."""
    tp_rank, tp_size, ep_rank, ep_size = _ranks_from_model(model)
    dp_size = 1
    if parallel_config is not None:
        want = int(getattr(parallel_config, "tensor_parallel_size", tp_size))
        if want != tp_size:
            raise errors.InvalidArgument(
                f"vLLM's tensor_parallel_size is {want}, the model's layers say tp_size "
                f"{tp_size}")
        if int(getattr(parallel_config, "pipeline_parallel_size", 1)) != 1:
            raise errors.InvalidArgument("pipeline parallelism is not supported by the wsync "
                                         "vLLM backend (pipeline_parallel_size must be 1)")
        dp_size = int(getattr(parallel_config, "data_parallel_size", 1) or 1)
        if dp_rank is None:
            dp_rank = int(getattr(parallel_config, "data_parallel_rank", 0) or 0)
    return Receiver(model, tp_rank=tp_rank, tp_size=tp_size, ep_rank=ep_rank, ep_size=ep_size,
                    dp_rank=dp_rank or 0, dp_size=dp_size, **options)


def colocation(colocated, rank):
    """(extra memberships, local socket) of destination rank `rank` under
    WsyncInitInfo.colocated; ((), None) without it. The worker then takes
    part in every transfer of the trainer group: colocate one vLLM server's
    ranks with the trainer ranks that feed only it (a second pool fed by the
    same trainer needs those trainer ranks' sidecars instead)."""
    if not colocated:
        return (), None
    what = f"init_info colocated={colocated!r}"
    unknown = sorted(set(colocated) - {"group", "size", "socket", "ranks"})
    missing = sorted({"size", "socket"} - set(colocated))
    if unknown or missing:
        raise errors.InvalidArgument(f"{what}: expected keys size, socket (and group, ranks); "
                                     f"missing {missing}, unknown {unknown}")
    group = colocated.get("group", "trainer")
    try:
        size = int(colocated["size"])
        ranks = colocated.get("ranks")
        if ranks is not None and rank >= len(ranks):
            raise errors.InvalidArgument(f"{what}: ranks {ranks} name no trainer rank for "
                                         f"destination rank {rank}")
        trainer_rank = int(ranks[rank]) if ranks is not None else rank
        socket = str(colocated["socket"]).format(rank=trainer_rank)
    except (TypeError, ValueError, KeyError, IndexError) as e:
        raise errors.InvalidArgument(f"{what}: {type(e).__name__}: {e} (size and ranks are "
                                     "integers, socket a path with at most {rank})") from None
    if not 0 <= trainer_rank < size:
        raise errors.InvalidArgument(f"{what}: trainer rank {trainer_rank} of destination rank "
                                     f"{rank} is outside {group} size {size}")
    return (f"{group}:{trainer_rank}:{size}",), socket
