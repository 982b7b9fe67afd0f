"""vLLM's sleep mode as the vLLM receiver sees it (private; re-exported by
wsync.vllm_receiver)."""


class CuMemSleep:
    """vLLM's sleep mode, seen through its CuMemAllocator: the weights are
    asleep when an allocation tagged "weights" is (``is_asleep``, or, in
    versions without it, holds a CPU backup). ``wake_up`` maps them back at the
    same addresses (so registered pointers stay valid). ``wake`` overrides how
    (the vLLM Worker's own ``wake_up(tags=["weights"])`` on the extension route)."""

    def __init__(self, allocator, wake=None):
        self.allocator = allocator
        self._wake = wake

    @classmethod
    def of_vllm(cls, wake=None):
        """The process's CuMemAllocator if vLLM made one (sleep mode on), else None."""
        try:
            from vllm.device_allocator.cumem import CuMemAllocator
        except ImportError:
            return None
        inst = getattr(CuMemAllocator, "instance", None)
        return None if inst is None else cls(inst, wake)

    def asleep(self):
        for data in list(getattr(self.allocator, "pointer_to_data", {}).values()):
            if getattr(data, "tag", None) != "weights":
                continue
            flag = getattr(data, "is_asleep", None)
            if flag is None:
                flag = getattr(data, "cpu_backup_tensor", None) is not None
            if flag:
                return True
        return False

    def wake_up(self):
        if self._wake is not None:
            self._wake()
        else:
            self.allocator.wake_up(tags=["weights"])
