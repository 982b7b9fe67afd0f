// StateStore: the file format (header, checksum), atomic saves, and the
// errors a damaged file gives.
#include "controller/server/state_store.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "controller/server/metrics.h"
#include "gtest/gtest.h"
#include "spdlog/sinks/ostream_sink.h"
#include "spdlog/spdlog.h"

namespace wsync::controller {
namespace {

std::string TempDir() {
  std::string dir = absl::StrCat(::testing::TempDir(), "/wsync-state-XXXXXX");
  EXPECT_NE(mkdtemp(dir.data()), nullptr);
  return dir;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

v1::ControllerState Sample() {
  v1::ControllerState s;
  v1::TransferState* t = s.add_transfers();
  t->set_name("weights");
  t->set_source_group("trainer");
  t->set_destination_group("inference");
  t->set_last_success_version(5);
  t->mutable_spec()->mutable_source()->add_tensors()->set_name("w");
  v1::SyncStatus* done = s.add_recent_syncs();
  done->set_sync_id("weights@5#9");
  done->set_phase(v1::SYNC_SUCCEEDED);
  s.set_next_sync_id(10);
  return s;
}

TEST(StateStore, Crc32IsTheIeeePolynomial) {
  EXPECT_EQ(Crc32("123456789"), 0xCBF43926u);
  EXPECT_EQ(Crc32(""), 0u);
}

class StateStoreModes : public ::testing::TestWithParam<StateFlush> {};

INSTANTIATE_TEST_SUITE_P(Flush, StateStoreModes,
                         ::testing::Values(StateFlush::kEverySave, StateFlush::kBackground),
                         [](const auto& info) {
                           return info.param == StateFlush::kEverySave ? "EverySave" : "Background";
                         });

TEST_P(StateStoreModes, SaveThenLoadGivesTheSameStateAndLeavesNoTemporaryFile) {
  const std::string dir = TempDir();
  StateStore store(dir + "/controller.state", GetParam());
  auto empty = store.Load();
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->transfers_size(), 0) << "a missing file is an empty state";
  ASSERT_TRUE(store.Save(Sample()).ok());
  v1::ControllerState next = Sample();
  next.mutable_transfers(0)->set_last_success_version(6);
  ASSERT_TRUE(store.Save(next).ok());
  auto loaded = store.Load();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->save_sequence(), 2);
  loaded->clear_save_sequence();
  EXPECT_EQ(loaded->SerializeAsString(), next.SerializeAsString());
  EXPECT_NE(access((dir + "/controller.state.tmp").c_str(), F_OK), 0);
  struct stat st {};
  ASSERT_EQ(stat((dir + "/controller.state").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u) << "only the controller's user reads its state";
  EXPECT_EQ(store.saves(), 2);
  EXPECT_TRUE(store.Flush().ok());
}

// What a controller crash (not a power cut) would leave: the file as the
// last Save put it, before any flush, read by another store (the restarted
// controller).
TEST_P(StateStoreModes, EachSaveIsInPlaceWhenSaveReturns) {
  const std::string path = TempDir() + "/controller.state";
  StateStore store(path, GetParam());
  v1::ControllerState s = Sample();
  for (int v = 1; v <= 200; ++v) {
    s.mutable_transfers(0)->set_last_success_version(v);
    ASSERT_TRUE(store.Save(s).ok());
    auto seen = StateStore(path).Load();
    ASSERT_TRUE(seen.ok()) << seen.status();
    ASSERT_EQ(seen->transfers(0).last_success_version(), v);
  }
  EXPECT_TRUE(store.Flush().ok());
  EXPECT_EQ(store.flush_mode(), GetParam());
}

// Saves alternate between <path> and <path>.alt, overwriting the older one
// in place: a write torn by a crash (here: the newer file damaged) leaves the
// other, previous state, and a restarted store goes on from it without
// writing over it.
TEST(StateStore, ATornSaveLeavesThePreviousStateInTheOtherFile) {
  const std::string path = TempDir() + "/controller.state";
  v1::ControllerState s = Sample();
  {
    StateStore store(path);
    for (int v = 1; v <= 3; ++v) {
      s.mutable_transfers(0)->set_last_success_version(v);
      ASSERT_TRUE(store.Save(s).ok());
    }
  }
  // Saves 1 and 3 went to <path>, save 2 to <path>.alt.
  std::string newest = ReadFile(path);
  ASSERT_FALSE(newest.empty());
  ASSERT_FALSE(ReadFile(path + ".alt").empty());
  newest[newest.size() / 2] ^= 0x01;
  WriteFile(path, newest);
  StateStore restarted(path);
  auto loaded = restarted.Load();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->transfers(0).last_success_version(), 2) << "the previous state";
  EXPECT_EQ(loaded->save_sequence(), 2);
  // The next save goes over the damaged file, not over the good one.
  s.mutable_transfers(0)->set_last_success_version(4);
  ASSERT_TRUE(restarted.Save(s).ok());
  auto again = StateStore(path).Load();
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->transfers(0).last_success_version(), 4);
  auto alt = DecodeState(ReadFile(path + ".alt"), path + ".alt");
  ASSERT_TRUE(alt.ok()) << alt.status();
  EXPECT_EQ(alt->transfers(0).last_success_version(), 2);
}

// A state file of the single-file layout (before the .alt file) is read,
// and the first save leaves it untouched (it goes to the other file).
TEST(StateStore, ASingleFileFromAnEarlierVersionIsReadAndKept) {
  const std::string path = TempDir() + "/controller.state";
  WriteFile(path, EncodeState(Sample()));
  StateStore store(path);
  auto loaded = store.Load();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->transfers(0).last_success_version(), 5);
  v1::ControllerState next = Sample();
  next.mutable_transfers(0)->set_last_success_version(6);
  ASSERT_TRUE(store.Save(next).ok());
  EXPECT_EQ(ReadFile(path), EncodeState(Sample())) << "the loaded file is not written over";
  auto reread = StateStore(path).Load();
  ASSERT_TRUE(reread.ok()) << reread.status();
  EXPECT_EQ(reread->transfers(0).last_success_version(), 6);
}

// A transfer saved as two encoded parts (the spec encoded once, the rest per
// save) reads back as the whole TransferState, and save_sequence is set by
// the store whatever the payload held.
TEST(StateStore, ATransferSavedInTwoEncodedPartsReadsBackWhole) {
  const v1::ControllerState whole = Sample();
  v1::TransferState spec_only;
  *spec_only.mutable_spec() = whole.transfers(0).spec();
  v1::TransferState rest = whole.transfers(0);
  rest.clear_spec();
  std::string payload;
  AppendTransferState(spec_only.SerializeAsString(), rest.SerializeAsString(), &payload);
  v1::ControllerState tail = whole;
  tail.clear_transfers();
  tail.set_save_sequence(99);
  tail.AppendToString(&payload);

  const std::string path = TempDir() + "/controller.state";
  StateStore store(path);
  ASSERT_TRUE(store.SaveSerialized(payload).ok());
  auto loaded = StateStore(path).Load();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->save_sequence(), 1);
  loaded->clear_save_sequence();
  EXPECT_EQ(loaded->SerializeAsString(), whole.SerializeAsString());
}

TEST(StateStore, TheFsyncModeFlagIsParsedAndABadOneNamed) {
  EXPECT_EQ(*ParseStateFlush("always"), StateFlush::kEverySave);
  EXPECT_EQ(*ParseStateFlush("background"), StateFlush::kBackground);
  absl::StatusOr<StateFlush> bad = ParseStateFlush("sometimes");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--state_fsync"), std::string::npos) << bad.status();
  EXPECT_NE(bad.status().message().find("sometimes"), std::string::npos) << bad.status();
}

TEST(StateStore, ADamagedFileIsAnErrorNamingTheFile) {
  const std::string dir = TempDir();
  const std::string path = dir + "/controller.state";
  StateStore store(path);
  ASSERT_TRUE(store.Save(Sample()).ok());
  const std::string good = ReadFile(path);

  std::string flipped = good;
  flipped[flipped.size() - 3] ^= 0x40;
  WriteFile(path, flipped);
  absl::StatusOr<v1::ControllerState> st = store.Load();
  EXPECT_EQ(st.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(st.status().message().find(path), std::string::npos) << st.status();
  EXPECT_NE(st.status().message().find("checksum"), std::string::npos) << st.status();

  WriteFile(path, good.substr(0, good.size() - 4));
  st = store.Load();
  EXPECT_EQ(st.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(st.status().message().find("bytes"), std::string::npos) << st.status();

  WriteFile(path, "garbage without a header");
  EXPECT_EQ(store.Load().status().code(), absl::StatusCode::kDataLoss);

  std::string future = good;
  future.replace(future.find("format=1"), 8, "format=7");
  WriteFile(path, future);
  st = store.Load();
  EXPECT_EQ(st.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(st.status().message().find("format 7"), std::string::npos) << st.status();

  auto aside = store.MoveAside();
  ASSERT_TRUE(aside.ok()) << aside.status();
  EXPECT_EQ(ReadFile(*aside), future);
  auto fresh = store.Load();
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ(fresh->transfers_size(), 0);
}

TEST(StateStore, ASaveIntoAMissingDirectoryFailsNamingIt) {
  StateStore store(TempDir() + "/no/such/dir/controller.state");
  absl::Status st = store.Save(Sample());
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("no/such/dir"), std::string::npos) << st;
}

// Through StateStore::SetDataSyncForTesting: fails (EIO) while
// g_failing_syncs is positive, counting down.
std::atomic<int> g_failing_syncs{0};
int FailingDataSync(int fd) {
  if (g_failing_syncs.fetch_sub(1) > 0) {
    errno = EIO;
    return -1;
  }
  g_failing_syncs.store(0);
  return ::fdatasync(fd);
}

// Lines the default logger writes while it lives.
class LogCapture {
 public:
  LogCapture() : sink_(std::make_shared<spdlog::sinks::ostream_sink_mt>(out_)) {
    spdlog::default_logger()->sinks().push_back(sink_);
  }
  ~LogCapture() {
    auto& sinks = spdlog::default_logger()->sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), sink_), sinks.end());
  }
  int Count(const std::string& text) const {
    int n = 0;
    std::istringstream lines(out_.str());
    for (std::string line; std::getline(lines, line);) n += line.find(text) != std::string::npos;
    return n;
  }

 private:
  std::ostringstream out_;
  std::shared_ptr<spdlog::sinks::ostream_sink_mt> sink_;
};

// A background flush that fails (fdatasync: EIO) is counted every time in
// wsync_state_save_failures_total and logged once per streak (it was logged
// every time and counted nowhere).
TEST(StateStore, FailedBackgroundFlushesAreCountedEachAndLoggedOncePerStreak) {
  LogCapture log;
  ControllerMetrics metrics;
  auto failures = [&] {
    for (const auto& f : metrics.registry().Collect()) {
      if (f.name == "wsync_state_save_failures_total") return f.metric.at(0).counter.value;
    }
    return -1.0;
  };
  StateStore store(TempDir() + "/controller.state", StateFlush::kBackground);
  metrics.CountFlushFailuresOf(&store);
  store.SetDataSyncForTesting(&FailingDataSync);
  auto save_and_flush = [&] {
    EXPECT_TRUE(store.Save(Sample()).ok()) << "the write itself succeeds";
    return store.Flush();
  };
  g_failing_syncs = 3;
  for (int i = 0; i < 3; ++i) {
    absl::Status flushed = save_and_flush();
    EXPECT_EQ(flushed.code(), absl::StatusCode::kUnavailable) << flushed;
    EXPECT_NE(flushed.message().find("fdatasync of"), std::string::npos) << flushed;
  }
  EXPECT_EQ(failures(), 3);
  EXPECT_EQ(log.Count("to the disk failed"), 1) << "once per streak";
  EXPECT_TRUE(save_and_flush().ok());
  EXPECT_EQ(log.Count("works again after 3 failed"), 1);
  g_failing_syncs = 2;  // a second streak
  EXPECT_FALSE(save_and_flush().ok());
  EXPECT_FALSE(save_and_flush().ok());
  EXPECT_TRUE(save_and_flush().ok());
  EXPECT_EQ(failures(), 5);
  EXPECT_EQ(log.Count("to the disk failed"), 2);
  auto loaded = store.Load();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->transfers(0).name(), "weights");
}

}  // namespace
}  // namespace wsync::controller
