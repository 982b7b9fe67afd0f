// StateStore: the file format (header, checksum), atomic saves, and the
// errors a damaged file gives.
#include "controller/server/state_store.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

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

TEST(StateStore, SaveThenLoadGivesTheSameStateAndLeavesNoTemporaryFile) {
  const std::string dir = TempDir();
  StateStore store(dir + "/controller.state");
  auto empty = store.Load();
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->transfers_size(), 0) << "a missing file is an empty state";
  ASSERT_TRUE(store.Save(Sample()).ok());
  v1::ControllerState next = Sample();
  next.mutable_transfers(0)->set_last_success_version(6);
  ASSERT_TRUE(store.Save(next).ok());
  auto loaded = store.Load();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->SerializeAsString(), next.SerializeAsString());
  EXPECT_NE(access((dir + "/controller.state.tmp").c_str(), F_OK), 0);
  struct stat st {};
  ASSERT_EQ(stat((dir + "/controller.state").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u) << "only the controller's user reads its state";
  EXPECT_EQ(store.saves(), 2);
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

}  // namespace
}  // namespace wsync::controller
