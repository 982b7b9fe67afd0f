"""Test-only stand-ins for the parts of vLLM the wsync backend meets (vLLM cannot
be installed here), each structurally identical to vLLM's and as small as possible:

* ``vllm.distributed.weight_transfer.base.WeightTransferEngine`` and
  ``...factory.WeightTransferEngineFactory`` as in vLLM commit
  02f250b03f38822ccdb63f27a3005d10ca81f385 (base.py) / 047c993cc49c (factory.py):
  the same method names, arguments and abstract methods;
* ``vllm.device_allocator.cumem.CuMemAllocator`` (``instance``, ``pointer_to_data``
  of AllocationData(handle, tag, cpu_backup_tensor, is_asleep), ``sleep``,
  ``wake_up(tags)``): here an allocation is a live parameter, and sleeping saves
  its contents and fills it with NaN (vLLM unmaps it), waking restores them;
* ``GpuWorkerCalls``: the calls vLLM's GPU Worker makes on the engine, in its order.

``install()`` puts the modules into sys.modules; ``uninstall()`` removes them.
"""
import abc
import dataclasses
import importlib
import sys
import time
import threading
import types

import torch

NAMES = ("vllm", "vllm.distributed", "vllm.distributed.weight_transfer",
         "vllm.distributed.weight_transfer.base", "vllm.distributed.weight_transfer.factory",
         "vllm.device_allocator", "vllm.device_allocator.cumem")


class WeightTransferEngine(abc.ABC):
    init_info_cls = None
    update_info_cls = None
    supports_draft_weight_update = True

    def __init__(self, config, vllm_config, device, model):
        self.config, self.vllm_config, self.device, self.model = (config, vllm_config, device,
                                                                  model)
        self.parallel_config = vllm_config.parallel_config
        self.model_config = vllm_config.model_config
        self._default_model_config, self._default_model = self.model_config, model

    def set_weight_update_target(self, model, model_config):
        self.model, self.model_config = model, model_config

    def reset_weight_update_target(self):
        self.model, self.model_config = self._default_model, self._default_model_config

    def parse_init_info(self, init_dict):
        try:
            return self.init_info_cls(**init_dict)
        except TypeError as e:
            raise ValueError(f"Invalid init_info for {type(self).__name__}: {e}") from e

    def parse_update_info(self, update_dict):
        try:
            return self.update_info_cls(**update_dict)
        except TypeError as e:
            raise ValueError(f"Invalid update_info for {type(self).__name__}: {e}") from e

    @abc.abstractmethod
    def init_transfer_engine(self, init_info): ...

    @abc.abstractmethod
    def start_weight_update(self): ...

    @abc.abstractmethod
    def finish_weight_update(self): ...

    def update_weights(self, update_info):
        self.receive_weights(self.parse_update_info(update_info))

    @abc.abstractmethod
    def receive_weights(self, update_info): ...

    @abc.abstractmethod
    def shutdown(self): ...

    @staticmethod
    @abc.abstractmethod
    def trainer_send_weights(iterator, trainer_args): ...


class WeightTransferEngineFactory:
    _registry = {}

    @classmethod
    def register_engine(cls, name, module_path_or_cls, class_name=None):
        if name in cls._registry:
            raise ValueError(f"Weight transfer engine '{name}' is already registered.")
        if isinstance(module_path_or_cls, str):
            if class_name is None:
                raise ValueError("class_name is required when registering with module path")
            path = module_path_or_cls
            cls._registry[name] = lambda: getattr(importlib.import_module(path), class_name)
        else:
            cls._registry[name] = lambda: module_path_or_cls

    @classmethod
    def create_engine(cls, config, vllm_config, device, model):
        if config.backend not in cls._registry:
            raise ValueError(f"Invalid weight transfer backend: {config.backend}. "
                             f"Available engines: {list(cls._registry)}")
        return cls._registry[config.backend]()(config, vllm_config, device, model)


@dataclasses.dataclass
class AllocationData:
    handle: tuple
    tag: str
    cpu_backup_tensor: torch.Tensor = None
    is_asleep: bool = False


class CuMemAllocator:
    instance = None

    def __init__(self):
        self.pointer_to_data = {}
        self.calls = []
        self._tensors = {}
        self._lock = threading.Lock()

    @classmethod
    def get_instance(cls):
        if cls.instance is None:
            cls.instance = cls()
        return cls.instance

    def track(self, tensors, tag="weights"):
        """What use_memory_pool(tag) records in vLLM: here, existing tensors."""
        for t in tensors:
            ptr = t.data_ptr()
            self._tensors[ptr] = t
            self.pointer_to_data[ptr] = AllocationData((0, t.numel() * t.element_size(), ptr,
                                                        0), tag)

    def sleep(self, offload_tags=None):
        self.calls.append(("sleep", offload_tags))
        for ptr, d in self.pointer_to_data.items():
            t = self._tensors[ptr]
            d.cpu_backup_tensor = t.detach().clone() if d.tag in (offload_tags or ()) else None
            t.detach().fill_(float("nan"))
            d.is_asleep = True

    def wake_up(self, tags=None):
        with self._lock:  # one allocator per process in vLLM; here ranks share it
            self.calls.append(("wake_up", tags))
            for ptr, d in self.pointer_to_data.items():
                if tags is None or d.tag in tags:
                    if d.cpu_backup_tensor is not None:
                        self._tensors[ptr].detach().copy_(d.cpu_backup_tensor)
                    d.cpu_backup_tensor, d.is_asleep = None, False


def install():
    mods = {n: types.ModuleType(n) for n in NAMES}
    for n in NAMES:
        mods[n].__path__ = []  # packages, so that submodule imports resolve
    mods["vllm.distributed.weight_transfer.base"].WeightTransferEngine = WeightTransferEngine
    mods["vllm.distributed.weight_transfer.factory"].WeightTransferEngineFactory = \
        WeightTransferEngineFactory
    mods["vllm.device_allocator.cumem"].CuMemAllocator = CuMemAllocator
    WeightTransferEngineFactory._registry = {}
    CuMemAllocator.instance = None
    for n, m in mods.items():
        sys.modules[n] = m


def uninstall():
    for n in NAMES:
        sys.modules.pop(n, None)


class GpuWorkerCalls:
    """The calls vllm/v1/worker/gpu_worker.py's Worker makes on its
    weight-transfer engine (the worker's own state machine included), read
    from the gpu_worker.py whose load_model creates the engine with
    (config, vllm_config, device, model), the signature of base.py at
    02f250b03f38 (cited by method, the stored copy carried no commit):

    * Worker.load_model, after model_runner.load_model():
      WeightTransferEngineFactory.create_engine(weight_transfer_config,
      vllm_config, device, model_runner.get_model())
    * Worker.init_weight_transfer_engine(init_info: dict):
      engine.init_transfer_engine(engine.parse_init_info(init_info))
    * Worker.start_weight_update(): refuses while an update is active;
      engine.start_weight_update(); active = True
    * Worker.update_weights(update_info: dict): refuses unless active;
      engine.update_weights(update_info); on any exception active = False
    * Worker.finish_weight_update(): refuses unless active;
      engine.finish_weight_update(); active = False
    * Worker.shutdown(): engine.shutdown()
    """

    def __init__(self, config, vllm_config, device, model):
        self.engine = WeightTransferEngineFactory.create_engine(config, vllm_config, device,
                                                                model)
        self.active = False

    def init_weight_transfer_engine(self, init_info):
        self.engine.init_transfer_engine(self.engine.parse_init_info(init_info))

    def start_weight_update(self):
        if self.active:
            raise RuntimeError("start_weight_update called while a weight update is already "
                               "active. Call finish_weight_update first.")
        self.engine.start_weight_update()
        self.active = True

    def update_weights(self, update_info):
        if not self.active:
            raise RuntimeError("start_weight_update must be called before update_weights.")
        try:
            self.engine.update_weights(update_info)
        except BaseException:
            self.active = False
            raise

    def finish_weight_update(self):
        if not self.active:
            raise RuntimeError("finish_weight_update called without a matching "
                               "start_weight_update.")
        self.engine.finish_weight_update()
        self.active = False

    def shutdown(self):
        self.engine.shutdown()


def replicas_at(client, version, want, timeout=10.0):
    """client.replicas_at(version) once it equals `want` (reports travel
    asynchronously), or its last value after `timeout`."""
    end = time.monotonic() + timeout
    got = client.replicas_at(version)
    while got != want and time.monotonic() < end:
        time.sleep(0.05)
        got = client.replicas_at(version)
    return got
