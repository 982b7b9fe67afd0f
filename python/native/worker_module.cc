// wsync._native.worker: the embedded worker (worker/embedded/embedded_worker.h)
// for Python (BindWorker, called by module.cc). The wsync.embedded module wraps
// it; use that. Every call that may
// block or join threads releases the GIL; a registered tensor's Python object
// is kept alive by the worker and released with the GIL held.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/logging.h"
#include "worker/embedded/embedded_worker.h"
#include "worker/node/backend_registry.h"

namespace py = pybind11;
using wsync::embedded::EmbeddedOptions;
using wsync::embedded::EmbeddedWorker;
using wsync::embedded::PointerTensor;
using wsync::embedded::WeightArena;

namespace {

// A Python object the worker keeps alive; dropped under the GIL from
// whichever thread holds the last reference.
struct PyRef {
  explicit PyRef(py::object o) : obj(std::move(o)) {}
  ~PyRef() {
    if (!Py_IsInitialized()) {
      obj.release();  // the interpreter is gone: nothing to release into
      return;
    }
    py::gil_scoped_acquire gil;
    obj = py::object();
  }
  py::object obj;
};

// wsync._worker.Error(code name, message); a reference the module keeps for
// the life of the process.
PyObject* g_error = nullptr;

[[noreturn]] void Raise(const absl::Status& s) {
  py::object e = py::handle(g_error)(absl::StatusCodeToString(s.code()), std::string(s.message()));
  PyErr_SetObject(g_error, e.ptr());
  throw py::error_already_set();
}

void Check(const absl::Status& s) {
  if (!s.ok()) Raise(s);
}

// Deletes the worker with the GIL released: its threads may need the GIL to
// drop the last references to registered tensors.
struct GilFreeDelete {
  void operator()(EmbeddedWorker* w) const {
    py::gil_scoped_release nogil;
    std::default_delete<EmbeddedWorker>()(w);
  }
};
using WorkerPtr = std::unique_ptr<EmbeddedWorker, GilFreeDelete>;

WorkerPtr Make(const std::string& controller,
               const std::vector<std::tuple<std::string, int, int>>& groups, int device,
               const std::string& node, const std::string& data_address, int metrics_port,
               const std::string& metrics_host, double round_timeout_s, int64_t staging_limit_bytes,
               int64_t staging_budget_bytes, const std::string& instance_id,
               const std::string& controller_ca, const std::string& cert, const std::string& key,
               const std::string& local_socket, int64_t busy_poll_ms,
               const std::string& controller_lane, double flip_ack_wait_s) {
  EmbeddedOptions o;
  o.controller = controller;
  // TLS when a CA names the controller's issuer; plaintext otherwise.
  o.tls.insecure = controller_ca.empty();
  o.tls.ca_file = controller_ca;
  o.tls.cert_file = cert;
  o.tls.key_file = key;
  for (const auto& [group, rank, size] : groups) {
    wsync::v1::Membership m;
    m.set_group(group);
    m.set_rank(rank);
    m.set_group_size(size);
    o.memberships.push_back(std::move(m));
  }
  o.device = device;
  o.node = node;
  o.data_address = data_address;
  o.metrics_port = metrics_port;
  o.metrics_host = metrics_host;
  o.round_timeout = absl::Seconds(round_timeout_s);
  o.staging_limit_bytes = staging_limit_bytes;
  o.staging_budget_bytes = staging_budget_bytes;
  o.instance_id = instance_id;
  o.local_socket = local_socket;
  o.busy_poll_ms = busy_poll_ms;
  o.controller_lane = controller_lane;
  o.flip_ack_wait = absl::Seconds(flip_ack_wait_s);
  absl::StatusOr<std::unique_ptr<EmbeddedWorker>> w;
  {
    py::gil_scoped_release nogil;
    w = EmbeddedWorker::Create(std::move(o));
  }
  if (!w.ok()) Raise(w.status());
  return WorkerPtr(w->release());
}

// (name, dtype value, shape, data pointer, bytes, device, keep-alive object).
using TensorArgs =
    std::tuple<std::string, int, std::vector<int64_t>, uintptr_t, int64_t, int, py::object>;

py::tuple Register(EmbeddedWorker& w, const std::string& group,
                   const std::vector<TensorArgs>& tensors, bool replace) {
  std::vector<PointerTensor> in;
  for (const auto& [name, dtype, shape, data, bytes, device, keep] : tensors) {
    PointerTensor t;
    t.name = name;
    t.dtype = static_cast<wsync::v1::DType>(dtype);
    t.shape = shape;
    t.data = data;
    t.bytes = bytes;
    t.device = device;
    t.hold = std::make_shared<PyRef>(keep);
    in.push_back(std::move(t));
  }
  absl::StatusOr<wsync::v1::RegisterTensorsResponse> r;
  {
    py::gil_scoped_release nogil;
    r = w.Register(group, std::move(in), replace);
  }
  if (!r.ok()) Raise(r.status());
  return py::make_tuple(r->num_tensors(), r->bytes());
}

py::dict Status(EmbeddedWorker& w) {
  wsync::v1::LocalStatusResponse s;
  bool running;
  {
    // No C++ lock is ever waited for with the GIL held: a thread that holds
    // the worker's locks may need the GIL to drop a tensor's Python reference.
    py::gil_scoped_release nogil;
    s = w.Status();
    running = w.running();
  }
  py::dict d;
  d["registered"] = s.registered();
  d["lease_id"] = s.lease_id();
  d["last_version"] = s.last_version();
  d["syncs_ok"] = s.syncs_ok();
  d["syncs_failed"] = s.syncs_failed();
  d["running"] = running;
  return d;
}

void SetServing(EmbeddedWorker& w, const std::string& group, int64_t version, int state,
                const std::string& replica, int32_t replica_ranks) {
  wsync::v1::SetServingRequest req;
  req.set_group(group);
  req.set_version(version);
  req.set_state(static_cast<wsync::v1::ServingState>(state));
  req.set_replica(replica);
  req.set_replica_ranks(replica_ranks);
  absl::Status s;
  {
    py::gil_scoped_release nogil;
    s = w.SetServing(req);
  }
  Check(s);
}

WeightArena CreateArena(EmbeddedWorker& w, int64_t bytes, int device, const std::string& name) {
  absl::StatusOr<WeightArena> a;
  {
    py::gil_scoped_release nogil;
    a = w.CreateWeightArena(device, bytes, name);
  }
  if (!a.ok()) Raise(a.status());
  return *std::move(a);
}

py::tuple CreateFlipArenas(EmbeddedWorker& w, int64_t bytes, int device, const std::string& name) {
  absl::StatusOr<std::pair<WeightArena, WeightArena>> p;
  {
    py::gil_scoped_release nogil;
    p = w.CreateFlipArenas(device, bytes, name);
  }
  if (!p.ok()) Raise(p.status());
  return py::make_tuple(std::move(p->first), std::move(p->second));
}

// A host arena's bytes as a writable uint8 buffer (numpy.frombuffer,
// torch.frombuffer); views over it keep the arena alive.
py::buffer_info ArenaBuffer(WeightArena& a) {
  if (a.device >= 0) {
    Raise(absl::FailedPreconditionError(
        absl::StrCat("weight arena ", a.handle, " lies on cuda:", a.device,
                     ": no host buffer (use its pointer, e.g. through __cuda_array_interface__)")));
  }
  return py::buffer_info(reinterpret_cast<void*>(a.base), 1,
                         py::format_descriptor<uint8_t>::format(), 1, {a.bytes}, {1},
                         /*readonly=*/false);
}

// One subscriber's sync events.
class Events {
 public:
  explicit Events(EmbeddedWorker* w)
      : worker_(w), queue_(w->Subscribe("embedded owner, wsync.embedded.Worker.events()")) {}
  ~Events() { Close(); }
  // The next event as a dict, or None when none came within `timeout_s`.
  py::object Next(double timeout_s) {
    wsync::v1::SyncEvent e;
    bool got;
    // A copy taken with the GIL held: close() from another thread may reset
    // queue_ while this one waits.
    std::shared_ptr<wsync::agent::EventQueue> queue = queue_;
    {
      py::gil_scoped_release nogil;
      got = queue != nullptr && queue->Pop(&e, absl::Seconds(timeout_s));
    }
    if (!got) return py::none();
    py::dict d;
    // "started", "finished"; staged syncs also "staged", "commit",
    // "committed", "rolled_back" (docs/staging.md).
    d["kind"] = absl::AsciiStrToLower(wsync::v1::SyncEvent::Kind_Name(e.kind()));
    d["sync_id"] = e.sync_id();
    d["transfer"] = e.transfer();
    d["version"] = e.version();
    d["ok"] = e.ok();
    d["error"] = e.error();
    d["untouched"] = e.untouched();
    d["serving_version"] = e.serving_version();
    // "committed" only: "swap", "flip" or "copy" (docs/commit-swap.md,
    // docs/commit-flip.md), the pause; a flip: the arena now serving.
    d["commit_kind"] = e.commit_kind();
    d["commit_seconds"] = e.commit_seconds();
    d["flipped_onto"] = e.flipped_onto();
    return d;
  }
  void Close() {
    if (queue_ != nullptr) worker_->Unsubscribe(queue_);
    queue_.reset();
  }

 private:
  EmbeddedWorker* worker_;  // kept alive by the Python object (keep_alive)
  std::shared_ptr<wsync::agent::EventQueue> queue_;
};

}  // namespace

namespace wsync::python {

void BindWorker(py::module_& m) {
  wsync::InitLogging("wsync-worker[embedded]");
  py::object base = py::module_::import("builtins").attr("RuntimeError");
  g_error = PyErr_NewException("wsync._native.worker.Error", base.ptr(), nullptr);
  m.attr("Error") = py::handle(g_error);

  m.def("backends", &wsync::node::BackendNames,
        "The data-plane backends of this build (\"host\", and \"cuda\" in a CUDA build).");

  py::class_<Events>(m, "Events")
      .def("next", &Events::Next, py::arg("timeout_s"))
      .def("close", &Events::Close);

  py::class_<WeightArena>(m, "WeightArena", py::buffer_protocol())
      .def_buffer(&ArenaBuffer)
      .def_readonly("handle", &WeightArena::handle)
      .def_readonly("ptr", &WeightArena::base)
      .def_readonly("nbytes", &WeightArena::bytes)
      .def_readonly("device", &WeightArena::device);

  py::class_<EmbeddedWorker, WorkerPtr>(m, "EmbeddedWorker")
      .def(py::init(&Make), py::arg("controller"), py::arg("groups"), py::arg("device") = -1,
           py::arg("node") = "", py::arg("data_address") = "127.0.0.1",
           py::arg("metrics_port") = -1, py::arg("metrics_host") = "127.0.0.1",
           py::arg("round_timeout_s") = 60.0, py::arg("staging_limit_bytes") = 0,
           py::arg("staging_budget_bytes") = 0, py::arg("instance_id") = "",
           py::arg("controller_ca") = "", py::arg("cert") = "", py::arg("key") = "",
           py::arg("local_socket") = "", py::arg("busy_poll_ms") = 0,
           py::arg("controller_lane") = "", py::arg("flip_ack_wait_s") = 30.0)
      .def("start",
           [](EmbeddedWorker& w) {
             absl::Status s;
             {
               py::gil_scoped_release nogil;
               s = w.Start();
             }
             Check(s);
           })
      .def("stop", &EmbeddedWorker::Stop, py::call_guard<py::gil_scoped_release>())
      .def("register", &Register, py::arg("group"), py::arg("tensors"), py::arg("replace") = false)
      .def("status", &Status)
      .def("create_weight_arena", &CreateArena, py::arg("bytes"), py::arg("device") = -1,
           py::arg("name") = "")
      .def("create_flip_arenas", &CreateFlipArenas, py::arg("bytes"), py::arg("device") = -1,
           py::arg("name") = "")
      .def(
          "ack_flip",
          [](EmbeddedWorker& w, int64_t handle) {
            absl::Status s;
            {
              py::gil_scoped_release nogil;
              s = w.AckFlip(handle);
            }
            Check(s);
          },
          py::arg("handle"))
      .def(
          "free_weight_arena",
          [](EmbeddedWorker& w, int64_t handle) {
            absl::Status s;
            {
              py::gil_scoped_release nogil;
              s = w.FreeWeightArena(handle);
            }
            Check(s);
          },
          py::arg("handle"))
      .def("set_serving", &SetServing, py::arg("group"), py::arg("version"), py::arg("state"),
           py::arg("replica") = "", py::arg("replica_ranks") = 0)
      .def(
          "hold_syncs",
          [](EmbeddedWorker& w, std::string reason) {
            absl::StatusOr<std::string> began;
            {
              py::gil_scoped_release nogil;
              began = w.HoldSyncs(std::move(reason));
            }
            Check(began.status());
            return *began;
          },
          py::arg("reason"))
      .def(
          "events", [](EmbeddedWorker& w) { return std::make_unique<Events>(&w); },
          py::keep_alive<0, 1>())
      .def_property_readonly("running",
                             [](EmbeddedWorker& w) {
                               py::gil_scoped_release nogil;
                               return w.running();
                             })
      .def_property_readonly("stopped",
                             [](EmbeddedWorker& w) {
                               py::gil_scoped_release nogil;
                               return w.stopped();
                             })
      .def_property_readonly("backend", &EmbeddedWorker::backend_name)
      .def_property_readonly("metrics_port", &EmbeddedWorker::metrics_port);
}

}  // namespace wsync::python
