#include "tools/args.h"

#include "gtest/gtest.h"

namespace wsync::tools {
namespace {

TEST(ArgsTest, ValuesBoolsAndPositionals) {
  FlagSpec spec{{"model", "top"}, {"json"}};
  auto a = ParseArgs({"spec.json", "--model", "m", "--top=3", "--json"}, spec);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->positional(), std::vector<std::string>{"spec.json"});
  EXPECT_EQ(a->Value("model"), "m");
  EXPECT_EQ(*a->IntValue("top", 10), 3);
  EXPECT_EQ(*a->IntValue("missing", 10), 10);
  EXPECT_TRUE(a->Has("json"));
  EXPECT_FALSE(a->Has("model2"));
}

TEST(ArgsTest, Errors) {
  FlagSpec spec{{"model", "top"}, {"json"}};
  auto unknown = ParseArgs({"--bogus"}, spec);
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("unknown flag --bogus"), std::string::npos);
  EXPECT_FALSE(ParseArgs({"--model"}, spec).ok());                   // missing value
  EXPECT_FALSE(ParseArgs({"--json=1"}, spec).ok());                  // bool with value
  EXPECT_FALSE(ParseArgs({"--top", "1", "--top", "2"}, spec).ok());  // twice
  auto bad_int = ParseArgs({"--top", "x"}, spec);
  ASSERT_TRUE(bad_int.ok());
  EXPECT_FALSE(bad_int->IntValue("top", 0).ok());
}

}  // namespace
}  // namespace wsync::tools
