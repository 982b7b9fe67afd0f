// ListWorkers pages (issue 18: one worker with 100k buffers made the list
// exceed default client message limits).
#include "controller/server/worker_pages.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace wsync::controller {
namespace {

v1::ListWorkersResponse Workers(int n, int buffers_of_first) {
  v1::ListWorkersResponse all;
  for (int i = 0; i < n; ++i) {
    v1::RegisteredWorker* w = all.add_workers();
    w->set_instance_id(absl::StrCat("w", i));
    const int buffers = i == 0 ? buffers_of_first : 2;
    for (int b = 0; b < buffers; ++b) {
      v1::BufferInfo* info = w->add_buffers();
      info->set_group("inference");
      info->set_name(absl::StrCat("model.layers.", b, ".self_attn.qkv_proj.weight"));
      info->set_bytes(1 << 20);
      info->add_shape(1024);
      info->add_shape(256);
    }
  }
  return all;
}

TEST(WorkerPagesTest, HundredThousandBuffersStayUnderTheDefaultClientLimit) {
  const v1::ListWorkersResponse all = Workers(3, 100'000);
  ASSERT_GT(all.ByteSizeLong(), 4u << 20) << "the unpaged answer exceeds gRPC's default 4 MiB";
  v1::ListWorkersRequest req;
  v1::ListWorkersResponse page;
  ASSERT_TRUE(PageWorkers(all, req, 100, 10'000, &page).ok());
  EXPECT_LT(page.ByteSizeLong(), 4u << 20);
  ASSERT_EQ(page.workers_size(), 1);
  EXPECT_EQ(page.workers(0).buffer_count(), 100'000);
  EXPECT_EQ(page.workers(0).buffers_size(), 10'000);
  EXPECT_TRUE(page.workers(0).buffers_truncated());
  // The rest on the next page.
  req.set_page_token(page.next_page_token());
  ASSERT_TRUE(PageWorkers(all, req, 100, 10'000, &page).ok());
  ASSERT_EQ(page.workers_size(), 2);
  EXPECT_EQ(page.workers(0).instance_id(), "w1");
  EXPECT_EQ(page.workers(1).buffer_count(), 2);
  EXPECT_FALSE(page.workers(1).buffers_truncated());
  EXPECT_EQ(page.next_page_token(), "");
}

TEST(WorkerPagesTest, PageSizeAndTokens) {
  const v1::ListWorkersResponse all = Workers(250, 2);
  v1::ListWorkersRequest req;
  v1::ListWorkersResponse page;
  int listed = 0, pages = 0;
  do {
    ASSERT_TRUE(PageWorkers(all, req, 100, 10'000, &page).ok());
    EXPECT_LE(page.workers_size(), 100);
    listed += page.workers_size();
    ++pages;
    req.set_page_token(page.next_page_token());
  } while (!page.next_page_token().empty());
  EXPECT_EQ(listed, 250);
  EXPECT_EQ(pages, 3);
  req.set_page_token("");
  req.set_page_size(7);
  ASSERT_TRUE(PageWorkers(all, req, 100, 10'000, &page).ok());
  EXPECT_EQ(page.workers_size(), 7);
  req.set_page_token("bogus");
  EXPECT_EQ(PageWorkers(all, req, 100, 10'000, &page).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace wsync::controller
