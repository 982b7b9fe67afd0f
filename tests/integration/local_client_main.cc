// A second local client of a worker (the attacker of issue 18): registers its
// own shared memory under a tensor name with replace=true. Exits with the
// gRPC status code of the answer.
//   local_client <socket> <group> <tensor> <dtype number> <bytes>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "tools/demo/owner.h"

int main(int argc, char** argv) {
  int dtype = 0;
  int64_t bytes = 0;
  if (argc != 6 || !absl::SimpleAtoi(argv[4], &dtype) || !absl::SimpleAtoi(argv[5], &bytes)) {
    std::fprintf(stderr, "usage: local_client <socket> <group> <tensor> <dtype> <bytes>\n");
    return 100;
  }
  const std::string shm = absl::StrCat("/wsync-attacker-", getpid());
  const int fd = shm_open(shm.c_str(), O_CREAT | O_RDWR | O_EXCL, 0600);
  if (fd < 0 || ftruncate(fd, bytes) != 0) return 101;
  close(fd);
  wsync::v1::RegisterTensorsRequest req;
  req.set_group(argv[2]);
  req.set_replace(true);
  wsync::v1::TensorRegistration* t = req.add_tensors();
  t->set_name(argv[3]);
  t->set_dtype(static_cast<wsync::v1::DType>(dtype));
  t->add_shape(bytes / wsync::DTypeSize(t->dtype()));
  t->mutable_shm()->set_name(shm);
  t->mutable_shm()->set_size(bytes);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  wsync::v1::RegisterTensorsResponse resp;
  const grpc::Status s = wsync::demo::LocalStub(argv[1])->RegisterTensors(&ctx, req, &resp);
  std::printf("code=%d %s\n", static_cast<int>(s.error_code()), s.error_message().c_str());
  shm_unlink(shm.c_str());
  return static_cast<int>(s.error_code());
}
