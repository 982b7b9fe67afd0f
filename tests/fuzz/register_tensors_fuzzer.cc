// libFuzzer target: a worker-local RegisterTensors request (binary proto, as
// the worker's local socket receives it) validated and opened by the
// worker's tensor table on the host backend. Every shm name is pointed at
// one of the fuzzer's own objects (or at a missing one), so no input maps
// anything else in /dev/shm (the first character of the name picks: "`" an
// empty object, "a" 64 bytes, "b" 1 MiB, "c" a missing one); a CUDA VMM token may name the one
// descriptor batch offered (descriptors of /dev/null: no real IPC). Whatever the table accepts is
// read end to end: a range outside the mapped object faults.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/fuzz/quiet_protobuf.h"
#include "worker/agent/tensor_table.h"
#include "worker/backends/host/host_backend.h"
#include "wsync/v1/worker_local.pb.h"

namespace {

constexpr int64_t kObjectBytes[] = {0, 64, 1 << 20};

// The fuzzer's shm objects, unlinked at exit.
struct Objects {
  std::vector<std::string> names;
  Objects() {
    for (int64_t bytes : kObjectBytes) {
      names.push_back(absl::StrCat("/wsync-fuzz-", getpid(), "-", bytes));
      const int fd = shm_open(names.back().c_str(), O_CREAT | O_RDWR | O_TRUNC, 0600);
      if (fd < 0 || ftruncate(fd, bytes) != 0) std::abort();
      close(fd);
    }
    names.push_back(absl::StrCat("/wsync-fuzz-", getpid(), "-absent"));
  }
  ~Objects() {
    for (const std::string& n : names) shm_unlink(n.c_str());
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Objects* objects = [] {
    static Objects o;
    return &o;
  }();
  wsync::v1::RegisterTensorsRequest req;
  if (!req.ParseFromArray(data, static_cast<int>(size))) return 0;
  for (wsync::v1::TensorRegistration& t : *req.mutable_tensors()) {
    if (!t.has_shm()) continue;
    const size_t pick = t.shm().name().empty() ? 0 : static_cast<uint8_t>(t.shm().name()[0]);
    t.mutable_shm()->set_name(objects->names[pick % objects->names.size()]);
  }
  wsync::host::HostBackend backend{wsync::plane::BackendConfig()};
  wsync::agent::TensorTable table({"g", "h"}, &backend);
  wsync::agent::TensorTable::FdBatches fds;
  fds["t"] = std::make_shared<const wsync::plane::FdBatch>(
      "t", std::vector<int>{open("/dev/null", O_RDONLY | O_CLOEXEC)});
  // Twice: the second time as a re-registration of the same names.
  for (int pass = 0; pass < 2; ++pass) {
    auto r = table.Register(req, fds);
    if (!r.ok()) return 0;
    for (const wsync::agent::TensorEntry& e : table.Snapshot().tensors) {
      volatile uint8_t sum = 0;
      const auto* p = static_cast<const uint8_t*>(e.data);
      for (int64_t i = 0; i < e.bytes; ++i) sum = sum + p[i];
      (void)sum;
    }
    (void)table.BufferInfos();
  }
  return 0;
}
