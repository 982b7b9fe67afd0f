// libFuzzer target: a layout spec as wsyncctl reads it (JSON text), through
// the strict checks (common/strict_json.h), protobuf's JSON parser and the
// compilation and validation of both sides (controller/plan).
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/strict_json.h"
#include "controller/plan/compiled_layout.h"
#include "google/protobuf/util/json_util.h"
#include "tests/fuzz/quiet_protobuf.h"
#include "tests/fuzz/spec_limits.h"
#include "wsync/v1/layout.pb.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string json(reinterpret_cast<const char*>(data), size);
  using wsync::v1::TransferSpec;
  if (!wsync::CheckStrictJson(json, *TransferSpec::descriptor(), "fuzz").ok()) return 0;
  TransferSpec spec;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  if (!google::protobuf::util::JsonStringToMessage(json, &spec, options).ok()) return 0;
  if (!wsync::fuzz::SpecWithinLimits(spec)) return 0;
  (void)wsync::plan::CompileSide(spec.source(), wsync::plan::SideRole::kSource);
  (void)wsync::plan::CompileSide(spec.destination(), wsync::plan::SideRole::kDestination);
  return 0;
}
