"""wsync on vLLM's older route: a worker extension driven by ``collective_rpc``.

    vllm serve MODEL --worker-extension-cls wsync.vllm_extension.WsyncWorkerExtension

vLLM adds this class to the bases of its GPU Worker (``--worker-extension-cls``), so
its methods run on every worker with ``self`` the vLLM Worker
(``self.model_runner``, ``self.vllm_config``, ``self.device``, ``self.wake_up``). The
trainer calls them on every rank with ``collective_rpc`` (``LLM.collective_rpc`` or
``AsyncLLM.collective_rpc``; docs/vllm.md):

    llm.collective_rpc("wsync_start", args=("controller:50051",))
    # per version, with generation paused (``pause_generation``):
    llm.collective_rpc("wsync_begin_update")       # every rank, before the trainer syncs
    handle = client.sync(v)                         # wsync.Client of the trainer
    llm.collective_rpc("wsync_receive", args=(v,))
    llm.collective_rpc("wsync_finish_update")      # then resume generation

The work is done by wsync.vllm_receiver.Receiver, shared with the WeightTransferEngine
adapter (wsync.vllm_engine); this class only finds the model, the ranks and vLLM's
sleep mode on the Worker. Method names carry a ``wsync_`` prefix so they cannot shadow
the Worker's own methods. Errors are wsync.errors exceptions naming the rank, the
version and, for a failed sync, the failed rank.
"""
from wsync import errors
from wsync.vllm_receiver import CuMemSleep, receiver_for


class WsyncWorkerExtension:
    """Mixed into vLLM's Worker; every method runs on one vLLM rank."""

    _wsync_receiver = None

    def _wsync_rx(self):
        if self._wsync_receiver is None:
            raise errors.FailedPrecondition("wsync is not started on this vLLM worker: call "
                                            "collective_rpc('wsync_start', args=(controller,))")
        return self._wsync_receiver

    def _wsync_sleep(self):
        # None without vLLM's cumem allocator (sleep mode off). The Worker's
        # wake_up also restores the buffers a level-2 sleep saved.
        return CuMemSleep.of_vllm(wake=lambda: self.wake_up(tags=["weights"]))

    def wsync_start(self, controller, group="inference", *, timeout=300.0, retries=0,
                    postprocess="auto", experts="separate", skip=(), hf_config=None,
                    worker=None, hold_outside_window=True, colocated=None, staged=False):
        """Starts this rank's embedded worker for the live model and registers
        every parameter. Returns {membership, spec}: spec is this rank's
        destination part (TransferSpec bytes) for wsync.vllm_live.merge.
        `colocated`: as WsyncInitInfo.colocated (wsync.vllm_engine).
        `staged`: staged syncs, committed by ``wsync_commit`` (docs/vllm.md,
        "Staged updates in vLLM")."""
        if self._wsync_receiver is not None:
            raise errors.FailedPrecondition(
                f"wsync already runs on this worker ({self._wsync_receiver.membership})")
        model = self.model_runner.get_model() if hasattr(self.model_runner, "get_model") \
            else self.model_runner.model
        device = getattr(self, "device", None)
        index = None
        if getattr(device, "type", "cpu") == "cuda":
            index = device.index or 0
        rx = receiver_for(model, parallel_config=self.vllm_config.parallel_config,
                          group=group, hf_config=hf_config, experts=experts, skip=tuple(skip),
                          device=index, sleep=self._wsync_sleep(), postprocess=postprocess,
                          timeout=timeout, retries=retries,
                          hold_outside_window=hold_outside_window, staged=staged)
        self._wsync_receiver = rx.start(controller, colocated=colocated, **(worker or {}))
        return {"membership": rx.membership, "spec": rx.live.spec.SerializeToString()}

    def wsync_begin_update(self):
        """Wakes the weights if asleep and opens the update window."""
        self._wsync_rx().begin()

    def wsync_receive(self, version, timeout=None):
        """Waits until `version` is written into the live parameters; closes
        the window on failure (begin again to retry)."""
        rx = self._wsync_rx()
        try:
            return rx.receive(int(version), timeout)
        except errors.WsyncError:
            rx.abort()
            raise

    def wsync_finish_update(self):
        """Post-processes where needed and records the version; refuses (and
        closes the window) while the weights are mixed."""
        rx = self._wsync_rx()
        try:
            return rx.finish()
        except errors.WsyncError:
            rx.abort()
            raise

    def wsync_commit(self, version, timeout=None, sync_id=""):
        """Staged receivers: commits the staged `version` into the live
        weights (vLLM runs this collective_rpc between two engine steps on
        every rank) and post-processes; `sync_id`: the trainer's
        handle.sync_id (Receiver.commit). Never raises for the sync's outcome,
        so that wsync.vllm_staged.StagedEngine sees every rank: returns
        {membership, ok, serving_version, unsafe, error, pause_s}."""
        rx = self._wsync_rx()
        try:
            rx.commit(int(version), timeout, sync_id)
            ok, error = True, ""
        except errors.WsyncError as e:
            ok, error = False, str(e)
        st = rx.status()
        return {"membership": rx.membership, "ok": ok, "serving_version": st.get("serving_version"),
                "unsafe": st.get("unsafe"), "error": error,
                "pause_s": (st.get("last_commit") or {}).get("pause_s")}

    def wsync_restart(self):
        """Replaces this rank's stopped embedded worker (Receiver.restart)."""
        self._wsync_rx().restart()
        return self._wsync_receiver.membership

    def wsync_status(self):
        return None if self._wsync_receiver is None else self._wsync_receiver.status()

    def wsync_stop(self):
        if self._wsync_receiver is not None:
            self._wsync_receiver.stop()
