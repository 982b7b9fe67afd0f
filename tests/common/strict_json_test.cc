// CheckStrictJson: duplicate keys and nested lists are refused where
// protobuf's JSON parser would accept them, naming the owner and the path.
#include "common/strict_json.h"

#include <string>

#include "gtest/gtest.h"
#include "wsync/v1/layout.pb.h"

namespace wsync {
namespace {

absl::Status Check(const std::string& json) {
  return CheckStrictJson(json, *v1::TransferSpec::descriptor(), "spec 'x.json'");
}

void ExpectRefused(const std::string& json, std::initializer_list<const char*> parts) {
  absl::Status s = Check(json);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << json;
  for (const char* p : parts) EXPECT_NE(s.message().find(p), std::string::npos) << p << " in " << s;
}

TEST(StrictJsonTest, WellFormedSpecsPass) {
  EXPECT_TRUE(Check(R"({"name": "t", "source": {"name": "trainer", "tensors": [
      {"name": "w", "dtype": "BF16", "shape": [4, "8"],
       "fragments": {"fragments": [{"rank": 0, "box": {"offset": [0, 0], "length": [4, 8]}}]}}]},
      "options": {"bucketBytes": "1024", "allowed_casts": [{"from": "FP32", "to": "BF16"}]},
      "unknownField": [[1]]})")
                  .ok());
  EXPECT_TRUE(Check(" {} ").ok());
  EXPECT_TRUE(Check(R"({"name": "a\"b\u0041"})").ok());
}

TEST(StrictJsonTest, NestedListsInScalarFieldsAreRefused) {
  ExpectRefused(R"({"source": {"tensors": [{"name": "w", "shape": [[64, 32]]}]}})",
                {"spec 'x.json'", "tensor 'w'", "field 'shape'", "source.tensors[0].shape[0]"});
  ExpectRefused(R"({"source": {"tensors": [{"shape": [1], "dtype": ["BF16"]}]}})",
                {"field 'dtype'", "source.tensors[0].dtype"});
  ExpectRefused(R"({"options": {"bucketBytes": {"a": 1}}})", {"field 'bucketBytes'"});
  ExpectRefused(R"({"source": {"tensors": {"name": "w"}}})", {"field 'tensors'", "must be a list"});
}

TEST(StrictJsonTest, DuplicateKeysAreRefusedAtAnyDepth) {
  ExpectRefused(R"({"name": "a", "name": "b"})", {"duplicate key 'name'"});
  ExpectRefused(R"({"source": {"name": "trainer", "tensors": [{"name": "w", "shape": [1]},
      {"name": "v", "shape": [2], "shape": [3]}]}})",
                {"tensor 'v' (source.tensors[1])", "duplicate key 'shape'"});
  // Unknown objects are checked for duplicates too.
  ExpectRefused(R"({"extra": {"k": 1, "k": 2}})", {"duplicate key 'k' at extra.k"});
}

TEST(StrictJsonTest, MalformedOrTooDeepTextIsRefused) {
  ExpectRefused("", {"not valid JSON"});
  ExpectRefused(R"({"name": "a")", {"not valid JSON"});
  ExpectRefused(R"({"name": "a"} x)", {"text after the document"});
  ExpectRefused(R"({"name": "a
"})",
                {"control character"});
  ExpectRefused(std::string(1000, '[') + std::string(1000, ']'), {"nested deeper than 64"});
}

}  // namespace
}  // namespace wsync
