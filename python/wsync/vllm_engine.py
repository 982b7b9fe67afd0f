"""vLLM's weight-transfer backend "wsync": a WeightTransferEngine over wsync.

Serve with it (docs/vllm.md):

    python -c 'import wsync.vllm_engine as e; e.register()'   # or the entry point
    vllm serve MODEL --weight-transfer-config '{"backend": "wsync"}'

``register()`` performs ``WeightTransferEngineFactory.register_engine("wsync",
"wsync.vllm_engine", "WsyncWeightTransferEngine")``; it is also exposed as the
``vllm.general_plugins`` entry point ``wsync`` (python/pyproject.toml), which vLLM
loads in every process, the worker processes included.

Written against vLLM's ``vllm/distributed/weight_transfer/base.py``
(WeightTransferEngine, commit 02f250b03f38822ccdb63f27a3005d10ca81f385) and the way
``vllm/v1/worker/gpu_worker.py`` drives it:

* ``Worker.load_model``: ``WeightTransferEngineFactory.create_engine(config,
  vllm_config, device, model)`` → ``__init__(config, vllm_config, device, model)``;
* ``Worker.init_weight_transfer_engine(init_info: dict)`` → ``parse_init_info`` →
  ``init_transfer_engine(WsyncInitInfo)``: starts this rank's embedded worker
  (wsync.embedded) and registers every live parameter (wsync.vllm_receiver);
* ``Worker.start_weight_update`` → ``start_weight_update()``: wakes the weights if
  asleep, opens the update window;
* ``Worker.update_weights(update_info: dict)`` → ``update_weights`` →
  ``parse_update_info`` → ``receive_weights(WsyncUpdateInfo)``: waits until the
  trainer's ``wsync.Client.sync(version)`` wrote ``version`` into the live parameters;
* ``Worker.finish_weight_update`` → ``finish_weight_update()``: post-processes where
  needed, records the version (``weight_version``);
* ``Worker.shutdown`` → ``shutdown()``.

vLLM is imported lazily and only for the base class: without vLLM the class is a
plain object with the same methods (the tests drive it so). Pausing / resuming
generation, resetting the prefix cache and the API server's ``weight_version`` belong
to vLLM's engine core and API server (``/pause``, ``/resume``, ``/finish_weight_update``
with ``weight_version``); docs/vllm.md gives the exact sequence.
"""
import dataclasses
import os

from wsync import errors
from wsync.vllm_receiver import CuMemSleep, receiver_for

BACKEND = "wsync"
ENV_CONTROLLER = "WSYNC_CONTROLLER"


def _base():
    try:
        from vllm.distributed.weight_transfer.base import WeightTransferEngine
    except ImportError:
        return object
    return WeightTransferEngine


@dataclasses.dataclass
class WsyncInitInfo:
    """``init_info`` of ``/init_weight_transfer_engine``. ``controller``:
    host:port of the wsync controller (else the engine config's ``controller``,
    else $WSYNC_CONTROLLER). ``group``: the destination group (ranks are
    dp_rank * tp + tp_rank). ``timeout``: seconds update_weights waits for a
    version; ``retries``: failed attempts at one version it waits through.
    ``postprocess``: "auto" | "never" | "always" (wsync.vllm_receiver).
    ``hold_outside_window``: refuse syncs, untouched, outside
    start_weight_update .. finish_weight_update (default; False: accept and
    report them).
    ``experts``: "separate" or "stacked" trainer expert naming. ``skip``:
    parameter names / patterns not transferred. ``hf_config``: cross-checks
    counts. ``worker``: extra wsync.embedded.Worker options (metrics_port,
    round_timeout, data_address, node).
    ``staged``: the trainer defines the transfer staged (docs/vllm.md,
    "Staged updates in vLLM"): vLLM keeps generating while the version streams
    into the shadow (no /pause); ``update_weights`` is the commit (it runs
    between engine steps on every rank), ``status()`` tells the staged
    version and whether the rank is unsafe.
    ``colocated``: trainer ranks share this server's GPUs, e.g.
    ``{"group": "trainer", "size": 8, "socket": "/run/wsync/colo-{rank}.sock"}``:
    each rank's worker also takes the trainer rank on its GPU (by default the
    one with this rank's number; ``"ranks": [...]`` maps rank -> trainer
    rank) and serves the local API on ``socket`` ({rank}: that trainer rank),
    where the trainer process registers its shards (wsync.torch.register(...,
    socket=...)). The worker then copies between them locally: needed with
    sleep mode, whose memory no other process can map, as NCCL refuses two
    ranks on one GPU."""
    controller: str = ""
    group: str = "inference"
    timeout: float = 300.0
    retries: int = 0
    postprocess: str = "auto"
    hold_outside_window: bool = True
    experts: str = "separate"
    skip: list = dataclasses.field(default_factory=list)
    hf_config: dict = None
    worker: dict = dataclasses.field(default_factory=dict)
    colocated: dict = None
    staged: bool = False


@dataclasses.dataclass
class WsyncUpdateInfo:
    """``update_info`` of ``/update_weights``: the wsync ``version`` the trainer
    syncs (``wsync.Client.sync(version)``), an optional wait ``timeout``, and
    (staged) the ``sync_id`` of the trainer's handle to commit."""
    version: int
    timeout: float = None
    sync_id: str = ""

    def __post_init__(self):
        if isinstance(self.version, bool) or not isinstance(self.version, int) or \
                self.version < 1:
            raise ValueError(f"update_info version {self.version!r}: expected the positive "
                             "integer version passed to wsync.Client.sync")


def _parse(cls, info, what):
    if isinstance(info, cls):
        return info
    try:
        return cls(**dict(info or {}))
    except TypeError as e:
        names = [f.name for f in dataclasses.fields(cls)]
        raise ValueError(f"invalid {what} for the wsync backend ({e}); fields: {names}") from e


class WsyncWeightTransferEngine(_base()):
    """vLLM WeightTransferEngine for backend "wsync" (module docstring)."""

    init_info_cls = WsyncInitInfo
    update_info_cls = WsyncUpdateInfo
    supports_draft_weight_update = False  # the destination is the main model's

    def __init__(self, config, vllm_config, device, model):
        # Same state as vLLM's base __init__, set here so that it holds without vLLM.
        self.config, self.vllm_config, self.device, self.model = (config, vllm_config,
                                                                  device, model)
        self.parallel_config = getattr(vllm_config, "parallel_config", None)
        self.model_config = getattr(vllm_config, "model_config", None)
        self._default_model, self._default_model_config = model, self.model_config
        self.receiver = None

    # vLLM's base API (base.py): parse_*, update_weights, the update target.
    def parse_init_info(self, init_dict):
        return _parse(WsyncInitInfo, init_dict, "init_info")

    def parse_update_info(self, update_dict):
        return _parse(WsyncUpdateInfo, update_dict, "update_info")

    def set_weight_update_target(self, model, model_config):
        if model is not self._default_model:
            raise errors.InvalidArgument("the wsync backend updates the model it registered "
                                         "at init_transfer_engine only (no draft model)")

    def reset_weight_update_target(self):
        self.model, self.model_config = self._default_model, self._default_model_config

    def update_weights(self, update_info):
        self.receive_weights(self.parse_update_info(update_info))
        self._synchronize()

    def _synchronize(self):
        if getattr(self.device, "type", "cpu") == "cuda":
            import torch
            torch.cuda.synchronize(self.device)

    # ----------------------------------------------------- the engine's steps --
    def init_transfer_engine(self, init_info):
        """Starts the embedded worker of this rank and registers the live model."""
        info = self.parse_init_info(init_info)
        if self.receiver is not None:
            raise errors.FailedPrecondition("the wsync transfer engine is already initialized "
                                            f"({self.receiver.membership})")
        controller = (info.controller or getattr(self.config, "controller", "") or
                      os.environ.get(ENV_CONTROLLER, ""))
        if not controller:
            raise errors.InvalidArgument(
                "no wsync controller address: pass init_info {'controller': 'host:port'}, or "
                f"set ${ENV_CONTROLLER} in the vLLM server's environment")
        device = getattr(self.device, "index", None)
        if getattr(self.device, "type", "cpu") != "cuda":
            device = None
        elif device is None:
            device = 0
        rx = receiver_for(self.model, parallel_config=self.parallel_config,
                          group=info.group, hf_config=info.hf_config, experts=info.experts,
                          skip=tuple(info.skip), device=device,
                          sleep=CuMemSleep.of_vllm(),  # None without vLLM's cumem allocator
                          postprocess=info.postprocess, timeout=info.timeout,
                          retries=info.retries, hold_outside_window=info.hold_outside_window,
                          staged=info.staged)
        self.receiver = rx.start(controller, colocated=info.colocated, **info.worker)

    def _rx(self):
        if self.receiver is None:
            raise errors.FailedPrecondition(
                "the wsync transfer engine is not initialized: call /init_weight_transfer_engine "
                "(init_info {'controller': ...}) first")
        return self.receiver

    def start_weight_update(self):
        self._rx().begin()

    def receive_weights(self, update_info):
        """Waits for ``update_info.version``. On failure the window closes (vLLM's
        worker ends the update when update_weights raises) and, where the sync
        failed, the weights stay reported mixed until a later sync succeeds."""
        rx = self._rx()
        try:
            if rx.staged:
                rx.commit(update_info.version, update_info.timeout, update_info.sync_id)
            else:
                rx.receive(update_info.version, update_info.timeout)
        except errors.WsyncError:
            rx.abort()  # vLLM's worker leaves the update too (gpu_worker.update_weights)
            raise

    def finish_weight_update(self):
        """Post-processes and records the version; refuses on mixed weights, in
        which case the window closes and generation must stay paused."""
        rx = self._rx()
        try:
            rx.finish()
        except errors.WsyncError:
            rx.abort()
            raise

    @property
    def weight_version(self):
        return None if self.receiver is None else self.receiver.weight_version

    def status(self):
        return None if self.receiver is None else self.receiver.status()

    def shutdown(self):
        if self.receiver is not None:
            self.receiver.stop()

    @staticmethod
    def trainer_send_weights(iterator, trainer_args):
        """The trainer's side: starts ``client.sync(version)`` and waits for it.
        wsync reads the trainer's registered tensors itself, so `iterator` is
        not consumed. trainer_args: {"client": wsync.Client, "version": int,
        "timeout": seconds (optional), "transfer": name (optional)}."""
        args = dict(trainer_args)
        client, version = args.get("client"), args.get("version")
        if client is None or version is None:
            raise ValueError("trainer_args for the wsync backend: expected {'client': "
                             "wsync.Client, 'version': int}, got keys " + str(sorted(args)))
        handle = client.sync(version, transfer=args.get("transfer"))
        return handle.wait(timeout=args.get("timeout"), show_progress=False)


def register(factory=None):
    """Registers backend "wsync" with vLLM's WeightTransferEngineFactory (lazy:
    by module and class name). Idempotent. `factory`: the factory class
    (default: vLLM's, imported here)."""
    if factory is None:
        from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory
        factory = WeightTransferEngineFactory
    if BACKEND in getattr(factory, "_registry", {}):
        return
    factory.register_engine(BACKEND, __name__, WsyncWeightTransferEngine.__name__)
