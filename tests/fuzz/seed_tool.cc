// Seeds for the binary fuzz targets: converts a proto3 JSON document of one
// wsync.v1 message type to its binary wire form.
//   wsync_fuzz_seed_tool TransferSpec|Plan|RegisterTensorsRequest|StateFuzzInput IN.json OUT.bin
#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>

#include "google/protobuf/util/json_util.h"
#include "state_fuzz_input.pb.h"
#include "wsync/v1/layout.pb.h"
#include "wsync/v1/plan.pb.h"
#include "wsync/v1/worker_local.pb.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr,
                 "usage: %s TransferSpec|Plan|RegisterTensorsRequest|StateFuzzInput IN.json "
                 "OUT.bin\n",
                 argv[0]);
    return 2;
  }
  const std::string type = argv[1];
  std::unique_ptr<google::protobuf::Message> m;
  if (type == "TransferSpec") m = std::make_unique<wsync::v1::TransferSpec>();
  if (type == "Plan") m = std::make_unique<wsync::v1::Plan>();
  if (type == "RegisterTensorsRequest") m = std::make_unique<wsync::v1::RegisterTensorsRequest>();
  if (type == "StateFuzzInput") m = std::make_unique<wsync::fuzz::StateFuzzInput>();
  if (m == nullptr) {
    std::fprintf(stderr, "unknown type %s\n", argv[1]);
    return 2;
  }
  std::ifstream in(argv[2]);
  const std::string json((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto s = google::protobuf::util::JsonStringToMessage(json, m.get());
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", argv[2], s.ToString().c_str());
    return 1;
  }
  std::ofstream out(argv[3], std::ios::binary);
  out << m->SerializeAsString();
  return out ? 0 : 1;
}
