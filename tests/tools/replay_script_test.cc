// tools/replay_plan.py replays `wsyncctl plan --json` output using only the
// documented format (docs/plan-format.md); this checks the documentation is
// enough to execute a plan, and that a corrupted plan is caught.
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/plan_pieces.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "tools/spec_io.h"
#include "wsync/v1/plan.pb.h"

namespace wsync::tools {
namespace {

int Shell(const std::string& cmd, std::string* out) {
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return -1;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out->append(buf, n);
  const int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(ReplayScriptTest, OutsideReplayerFollowsTheDocs) {
  std::string ignored;
  if (Shell("python3 --version", &ignored) != 0) GTEST_SKIP() << "python3 not installed";
  const std::string dir = ::testing::TempDir();
  const std::string spec = dir + "/replay_spec.json", plan = dir + "/replay_plan.json";
  const std::string script = std::string(WSYNC_SOURCE_DIR) + "/tools/replay_plan.py";
  std::string out;
  ASSERT_EQ(Shell(absl::StrCat(WSYNCCTL_PATH,
                               " catalog --model tiny-qwen3-moe --source megatron:tp2,pp2,dp2,ep2"
                               " --destination vllm-tp:2x2,ep --trainer-dtype fp32 --out ",
                               spec),
                  &out),
            0)
      << out;
  ASSERT_EQ(Shell(absl::StrCat(WSYNCCTL_PATH, " plan ", spec, " --json > ", plan), &out), 0) << out;
  out.clear();
  EXPECT_EQ(Shell(absl::StrCat("python3 ", script, " ", spec, " ", plan), &out), 0) << out;
  EXPECT_NE(out.find("replay: OK"), std::string::npos) << out;

  // Shift one piece's destination by one element: the replay must notice.
  std::ifstream in(plan);
  std::stringstream text;
  text << in.rdbuf();
  v1::Plan p;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(text.str(), &p).ok());
  ASSERT_GT(p.buckets_size(), 0);
  v1::TensorView* dst = p.mutable_buckets(0)->mutable_pieces(0)->mutable_dst();
  dst->set_byte_offset(dst->byte_offset() + 2);
  auto json = ToJson(p, false);
  ASSERT_TRUE(json.ok());
  const std::string bad = dir + "/replay_plan_bad.json";
  std::ofstream(bad) << *json;
  out.clear();
  EXPECT_EQ(Shell(absl::StrCat("python3 ", script, " ", spec, " ", bad), &out), 1) << out;
  EXPECT_NE(out.find("replay: FAILED"), std::string::npos) << out;
}

// Block fp8 serving: sender-side quantized pieces with their scale pieces,
// relays of fp8 + scales, and receiver-side Quantize ops (fused parts cut
// blocks), replayed and checked against the script's own quantizer.
TEST(ReplayScriptTest, OutsideReplayerQuantizesBlockFp8) {
  std::string ignored;
  if (Shell("python3 --version", &ignored) != 0) GTEST_SKIP() << "python3 not installed";
  const std::string dir = ::testing::TempDir();
  const std::string spec = dir + "/replay_fp8_spec.json", plan = dir + "/replay_fp8_plan.json";
  const std::string script = std::string(WSYNC_SOURCE_DIR) + "/tools/replay_plan.py";
  std::string out;
  ASSERT_EQ(Shell(absl::StrCat(WSYNCCTL_PATH,
                               " catalog --model tiny-mla --source fsdp:1 --destination vllm-tp:1x3"
                               " --fp8-block --out ",
                               spec),
                  &out),
            0)
      << out;
  ASSERT_EQ(Shell(absl::StrCat(WSYNCCTL_PATH, " plan ", spec, " --json > ", plan), &out), 0) << out;
  std::ifstream in(plan);
  std::stringstream text;
  text << in.rdbuf();
  v1::Plan p;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(text.str(), &p).ok());
  int quantized = 0;
  v1::Piece* scale_piece = nullptr;
  for (v1::Bucket& b : *p.mutable_buckets()) {
    for (v1::Piece& piece : *b.mutable_pieces()) {
      quantized += piece.quant_block_size() > 0;
      if (piece.scales_of() != 0 && scale_piece == nullptr) scale_piece = &piece;
    }
  }
  ASSERT_GT(quantized, 0);
  ASSERT_GT(p.quantizes_size(), 0);
  ASSERT_NE(scale_piece, nullptr);
  out.clear();
  EXPECT_EQ(Shell(absl::StrCat("python3 ", script, " ", spec, " ", plan), &out), 0) << out;
  EXPECT_NE(out.find("replay: OK"), std::string::npos) << out;

  // Scales written one element off, or a quantize input moved: both caught.
  for (int mutation = 0; mutation < 2; ++mutation) {
    v1::Plan bad_plan = p;
    if (mutation == 0) {
      for (v1::Bucket& b : *bad_plan.mutable_buckets()) {
        for (v1::Piece& piece : *b.mutable_pieces()) {
          if (piece.scales_of() != 0) {
            piece.mutable_dst()->set_byte_offset(piece.dst().byte_offset() + 4);
            break;
          }
        }
      }
    } else {
      v1::QuantizeInput* in0 = bad_plan.mutable_quantizes(0)->mutable_inputs(0);
      in0->set_offset(in0->offset_size() - 1, in0->offset(in0->offset_size() - 1) + 1);
    }
    auto json = ToJson(bad_plan, false);
    ASSERT_TRUE(json.ok());
    const std::string bad = absl::StrCat(dir, "/replay_fp8_bad", mutation, ".json");
    std::ofstream(bad) << *json;
    out.clear();
    EXPECT_EQ(Shell(absl::StrCat("python3 ", script, " ", spec, " ", bad), &out), 1) << out;
    EXPECT_NE(out.find("replay: FAILED"), std::string::npos) << out;
  }
}

// Piece runs (a compact planner's buckets, here rewritten by the test
// compactor): they reach the JSON as the proto's JSON mapping writes them
// (`wsyncctl plan --json` prints through the same ToJson) and read back
// equal; the script writes them out and replays OK. The same plan with its
// runs dropped fails: the members' bytes are checked, not assumed.
TEST(ReplayScriptTest, OutsideReplayerExpandsPieceRuns) {
  std::string ignored;
  if (Shell("python3 --version", &ignored) != 0) GTEST_SKIP() << "python3 not installed";
  const std::string dir = ::testing::TempDir();
  const std::string spec = dir + "/replay_runs_spec.json", plan = dir + "/replay_runs_plan.json";
  const std::string script = std::string(WSYNC_SOURCE_DIR) + "/tools/replay_plan.py";
  std::string out;
  ASSERT_EQ(Shell(absl::StrCat(WSYNCCTL_PATH,
                               " catalog --model tiny-qwen3-moe --source fsdp:2"
                               " --destination vllm-tp:2x1,ep --out ",
                               spec),
                  &out),
            0)
      << out;
  ASSERT_EQ(Shell(absl::StrCat(WSYNCCTL_PATH, " plan ", spec, " --json > ", plan), &out), 0) << out;
  std::ifstream in(plan);
  std::stringstream text;
  text << in.rdbuf();
  v1::Plan p;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(text.str(), &p).ok());
  ASSERT_TRUE(HasPieceRuns(p)) << "the planner wrote no piece run";
  auto json = ToJson(p, false);
  ASSERT_TRUE(json.ok());
  for (const char* key : {"\"runs\":", "\"first\":", "\"count\":", "\"bucketStep\":"}) {
    EXPECT_NE(json->find(key), std::string::npos) << key;
  }
  v1::Plan back;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(*json, &back).ok());
  EXPECT_EQ(back.SerializeAsString(), p.SerializeAsString());
  const std::string runs = dir + "/replay_runs_compact.json";
  std::ofstream(runs) << *json;
  out.clear();
  EXPECT_EQ(Shell(absl::StrCat("python3 ", script, " ", spec, " ", runs), &out), 0) << out;
  EXPECT_NE(out.find("replay: OK"), std::string::npos) << out;

  for (int mutation = 0; mutation < 2; ++mutation) {
    v1::Plan bad_plan = p;
    for (v1::Bucket& b : *bad_plan.mutable_buckets()) {
      if (b.runs_size() == 0) continue;
      if (mutation == 0) {
        b.clear_runs();  // what a reader ignoring runs would replay
      } else {
        b.mutable_runs(0)->set_dst_buffer_step(-1000);  // the last member names no buffer
      }
      break;
    }
    auto bad_json = ToJson(bad_plan, false);
    ASSERT_TRUE(bad_json.ok());
    const std::string bad = absl::StrCat(dir, "/replay_runs_bad", mutation, ".json");
    std::ofstream(bad) << *bad_json;
    out.clear();
    EXPECT_EQ(Shell(absl::StrCat("python3 ", script, " ", spec, " ", bad), &out), 1) << out;
    EXPECT_NE(out.find("replay: FAILED"), std::string::npos) << out;
  }
}

// A stacked plan (`wsyncctl plan --stacking on`): rows of runs (outerCount)
// written back from stacked experts, replayed by the script from the docs;
// a row step that moves the last row off its buffers fails.
TEST(ReplayScriptTest, OutsideReplayerExpandsRowsOfRuns) {
  std::string ignored;
  if (Shell("python3 --version", &ignored) != 0) GTEST_SKIP() << "python3 not installed";
  const std::string dir = ::testing::TempDir();
  const std::string spec = dir + "/replay_rows_spec.json", plan = dir + "/replay_rows_plan.json";
  const std::string script = std::string(WSYNC_SOURCE_DIR) + "/tools/replay_plan.py";
  std::string out;
  ASSERT_EQ(Shell(absl::StrCat(WSYNCCTL_PATH,
                               " catalog --model tiny-qwen3-moe --source fsdp:2"
                               " --destination vllm-tp:2x1,ep --out ",
                               spec),
                  &out),
            0)
      << out;
  ASSERT_EQ(Shell(absl::StrCat(WSYNCCTL_PATH, " plan ", spec, " --stacking on --json > ", plan),
                  &out),
            0)
      << out;
  out.clear();
  EXPECT_EQ(Shell(absl::StrCat("python3 ", script, " ", spec, " ", plan), &out), 0) << out;
  EXPECT_NE(out.find("replay: OK"), std::string::npos) << out;

  std::ifstream in(plan);
  std::stringstream text;
  text << in.rdbuf();
  v1::Plan p;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(text.str(), &p).ok());
  v1::PieceRun* rows = nullptr;
  for (v1::Bucket& b : *p.mutable_buckets()) {
    for (v1::PieceRun& r : *b.mutable_runs()) {
      if (r.outer_count() >= 2 && rows == nullptr) rows = &r;
    }
  }
  ASSERT_NE(rows, nullptr) << "the stacked plan has no rows of runs";
  rows->set_outer_dst_byte_step(rows->outer_dst_byte_step() + 2);  // later rows one element off
  auto json = ToJson(p, false);
  ASSERT_TRUE(json.ok());
  const std::string bad = dir + "/replay_rows_bad.json";
  std::ofstream(bad) << *json;
  out.clear();
  EXPECT_EQ(Shell(absl::StrCat("python3 ", script, " ", spec, " ", bad), &out), 1) << out;
  EXPECT_NE(out.find("replay: FAILED"), std::string::npos) << out;
}

}  // namespace
}  // namespace wsync::tools
