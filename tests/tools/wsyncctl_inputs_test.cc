// wsyncctl on hostile inputs (issue 18): a strided fragment whose replay
// would need terabytes, nested lists and duplicate keys in a spec. Each is a
// clear error with an exit code, never an abort or a silently changed spec.
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/tools/run_ctl.h"

namespace wsync::tools {
namespace {

using Result = tools_testing::CtlResult;

Result Ctl(const std::string& args) { return tools_testing::RunCtl(args); }

std::string WriteSpec(const std::string& name, const std::string& text) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/wsyncctl_inputs_", name);
  std::ofstream(path) << text;
  return path;
}

// One bf16 tensor `w` of shape [2, 4]: the source as `source_tensor` gives
// it, the destination replicated on worker 1.
std::string Spec(const std::string& source_tensor) {
  return absl::StrCat(R"({"source": {"ranks": [{"worker": 0, "node": "a"}], "tensors": [)",
                      source_tensor, R"(]},
  "destination": {"ranks": [{"worker": 1, "node": "a"}],
    "tensors": [{"name": "w", "dtype": "BF16", "shape": [2, 4],
                 "mesh": {"meshShape": [1], "ranks": [0], "placements": [{"replicate": {}}]}}]}})");
}

constexpr char kStridedSource[] =
    R"({"name": "w", "dtype": "BF16", "shape": [2, 4],
        "fragments": {"fragments": [{"rank": 0, "box": {"offset": [0, 0], "length": [2, 4]},
                                     "strides": ["1099511627776", "1"]}]}})";

// Issue 18: --verify-max-gib counted 8 elements for this fragment, then the
// replay allocated its 2 TiB strided extent and died of std::bad_alloc.
TEST(WsyncctlInputsTest, VerifyCountsTheStridedExtentOfFragments) {
  const std::string spec = WriteSpec("strided.json", Spec(kStridedSource));
  Result plan = Ctl("plan " + spec);
  ASSERT_EQ(plan.code, 0) << "the spec itself is valid: " << plan.out;
  Result r = Ctl("plan --verify " + spec);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("--verify-max-gib 16"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("2048.00 GiB"), std::string::npos) << "the strided extent: " << r.out;
  EXPECT_EQ(r.out.find("bad_alloc"), std::string::npos) << r.out;
  Result bad_limit = Ctl("plan --verify --verify-max-gib 99999999999999 " + spec);
  EXPECT_EQ(bad_limit.code, 2) << bad_limit.out;
  EXPECT_NE(bad_limit.out.find("--verify-max-gib"), std::string::npos) << bad_limit.out;
}

// Issue 18: protobuf's JSON parser read [[64, 32]] as [64, 32].
TEST(WsyncctlInputsTest, NestedListsAreRefusedNamingTensorAndField) {
  const std::string spec =
      WriteSpec("nested.json", Spec(R"({"name": "w", "dtype": "BF16", "shape": [[2, 4]],
               "mesh": {"meshShape": [1], "ranks": [0], "placements": [{"replicate": {}}]}})"));
  Result r = Ctl("plan " + spec);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("tensor 'w'"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("field 'shape'"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("source.tensors[0].shape[0]"), std::string::npos) << r.out;
}

// Issue 18: the last of two keys won silently.
TEST(WsyncctlInputsTest, DuplicateKeysAreRefusedNamingTensorAndField) {
  const std::string spec = WriteSpec(
      "duplicate.json", Spec(R"({"name": "w", "dtype": "BF16", "shape": [2, 4], "dtype": "FP32",
               "mesh": {"meshShape": [1], "ranks": [0], "placements": [{"replicate": {}}]}})"));
  Result r = Ctl("plan " + spec);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("tensor 'w'"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("duplicate key 'dtype'"), std::string::npos) << r.out;
  // At the top level too.
  const std::string top = WriteSpec("duplicate_top.json", R"({"name": "a", "name": "b"})");
  Result t = Ctl("plan " + top);
  EXPECT_EQ(t.code, 2) << t.out;
  EXPECT_NE(t.out.find("duplicate key 'name'"), std::string::npos) << t.out;
}

}  // namespace
}  // namespace wsync::tools
