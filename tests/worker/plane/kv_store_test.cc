#include "worker/plane/kv_store.h"

#include <unistd.h>

#include <filesystem>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace wsync::transport {
namespace {

void ExerciseStore(KvStore& store) {
  EXPECT_EQ(store.Get("missing", absl::Now() + absl::Milliseconds(50)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  ASSERT_TRUE(store.Set("a/b", std::string("x\0y", 3)).ok());
  auto v = store.Get("a/b", absl::Now());
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, std::string("x\0y", 3));
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(100));
    ASSERT_TRUE(store.Set("late", "value").ok());
  });
  auto late = store.Get("late", absl::Now() + absl::Seconds(10));
  setter.join();
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_EQ(*late, "value");
  ASSERT_TRUE(store.Set("empty", "").ok());
  auto empty = store.Get("empty", absl::Now());
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(*empty, "");
}

TEST(KvStoreTest, InMemory) {
  InMemoryKvStore store;
  ExerciseStore(store);
}

TEST(KvStoreTest, File) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / absl::StrCat("wsync_kvt_", getpid())).string();
  std::filesystem::create_directories(dir);
  FileKvStore store(dir);
  ExerciseStore(store);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace wsync::transport
