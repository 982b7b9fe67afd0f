// Conformance suite every DataOps implementation must pass (the contract in
// worker/plane/data_ops.h). A backend's test binary includes this header in
// exactly one .cc, implements DataOpsTestFactory and instantiates the suite:
//
//   using wsync::plane::conformance::DataOpsConformanceTest;
//   INSTANTIATE_TEST_SUITE_P(Host, DataOpsConformanceTest,
//                            ::testing::Values(std::make_shared<HostFactory>()),
//                            DataOpsConformanceTest::ParamName);
//
// Covered: staging allocation, casts bit for bit against common/cast.h
// (strided on both sides), pack / unpack through staging, reduce semantics
// against ReduceElements, call order without waits, prepared lists replayed
// on the current bytes, errors that name the item, and bucket checksums from
// views (QueueWireChecksum) against the packed bucket's.
#ifndef WSYNC_TESTS_WORKER_PLANE_DATA_OPS_CONFORMANCE_H_
#define WSYNC_TESTS_WORKER_PLANE_DATA_OPS_CONFORMANCE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/chunk_hash.h"
#include "gtest/gtest.h"
#include "tests/worker/plane/plane_test_memory.h"
#include "worker/plane/data_ops.h"

namespace wsync::plane::conformance {

class DataOpsTestFactory : public TestMemory {
 public:
  virtual std::string Name() const = 0;
  virtual absl::StatusOr<std::unique_ptr<exec::DataOps>> Create() = 0;
};

class DataOpsConformanceTest
    : public ::testing::TestWithParam<std::shared_ptr<DataOpsTestFactory>> {
 public:
  static std::string ParamName(
      const ::testing::TestParamInfo<std::shared_ptr<DataOpsTestFactory>>& info) {
    return info.param->Name();
  }

 protected:
  void SetUp() override {
    if (const std::string why = factory().Unavailable(); !why.empty()) GTEST_SKIP() << why;
    auto ops = factory().Create();
    ASSERT_TRUE(ops.ok()) << ops.status();
    ops_ = std::move(*ops);
  }
  DataOpsTestFactory& factory() { return *GetParam(); }
  exec::DataOps& ops() { return *ops_; }

  // Backend memory holding `host`'s bytes.
  std::shared_ptr<uint8_t> Upload(const std::vector<uint8_t>& host) {
    return factory().Upload(host);
  }
  std::vector<uint8_t> Download(const void* p, size_t bytes) {
    return factory().Download(p, bytes);
  }
  // A call's status, or the deferred one Synchronize() reports.
  absl::Status Settle(absl::Status issued) {
    absl::Status s = ops().Synchronize();
    return issued.ok() ? s : issued;
  }

  std::unique_ptr<exec::DataOps> ops_;
};

TEST_P(DataOpsConformanceTest, StagingIsAlignedAndAtLeastTheSizeAsked) {
  auto s = ops().AllocateStaging(1000);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_GE(s->bytes(), 1000);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(s->data()) % 256, 0u);
  auto empty = ops().AllocateStaging(0);
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->bytes(), 0);
  EXPECT_FALSE(ops().AllocateStaging(-1).ok());
}

// Strided source (padded rows) -> transposed destination, for every cast the
// interpreter uses: each element equals common/cast.h's conversion, bit for
// bit.
TEST_P(DataOpsConformanceTest, StridedCopiesCastBitForBitAsCommonCast) {
  constexpr int64_t kRows = 5, kCols = 7, kPitch = 9;
  const std::vector<std::pair<DType, DType>> casts = {
      {v1::FP32, v1::FP32}, {v1::FP32, v1::BF16}, {v1::FP32, v1::FP16}, {v1::FP32, v1::FP8_E4M3},
      {v1::BF16, v1::FP32}, {v1::FP16, v1::BF16}, {v1::BF16, v1::BF16}};
  for (const auto& [from, to] : casts) {
    SCOPED_TRACE(absl::StrCat(DTypeName(from), " -> ", DTypeName(to)));
    if (!CanConvert(from, to)) continue;
    const int64_t fs = DTypeSize(from), ts = DTypeSize(to);
    const std::vector<uint8_t> src_host = CastFrom(TestFloats(kRows * kPitch, 7), from);
    auto src = Upload(src_host);
    std::vector<uint8_t> sentinel(kRows * kCols * ts, 0xEE);
    auto dst = Upload(sentinel);
    const exec::CopyItem item{View2D(src.get(), from, kRows, kCols, kPitch, 1),
                              View2D(dst.get(), to, kRows, kCols, 1, kRows)};
    ASSERT_TRUE(Settle(ops().Copy({item})).ok());
    const std::vector<uint8_t> got = Download(dst.get(), sentinel.size());
    for (int64_t r = 0; r < kRows; ++r) {
      for (int64_t c = 0; c < kCols; ++c) {
        uint8_t want[8] = {};
        ASSERT_TRUE(ConvertElements(At(src_host, fs, r, c, kPitch, 1), from, want, to, 1).ok());
        ASSERT_EQ(std::memcmp(At(got, ts, r, c, 1, kRows), want, ts), 0)
            << "element (" << r << ", " << c << ")";
      }
    }
  }
}

// Two items packed into one staging allocation at their offsets (one cast
// to the wire dtype), then unpacked into contiguous destinations.
TEST_P(DataOpsConformanceTest, PackThenUnpackMovesEveryElementThroughStaging) {
  constexpr int64_t kRows = 4, kCols = 6, kPitch = 8;
  const std::vector<uint8_t> src_host = CastFrom(TestFloats(kRows * kPitch, 11), v1::FP32);
  auto src = Upload(src_host);
  auto staging = ops().AllocateStaging(1024);
  ASSERT_TRUE(staging.ok()) << staging.status();
  std::vector<uint8_t> sentinel(kRows * kCols * 4, 0xEE);
  auto dst_a = Upload(sentinel);
  auto dst_b = Upload(sentinel);
  exec::PackItem pa, pb;
  pa.src = pb.src = View2D(src.get(), v1::FP32, kRows, kCols, kPitch, 1);
  pa.staging_offset = 256;
  pa.wire_dtype = v1::BF16;
  pb.staging_offset = 512;
  pb.wire_dtype = v1::FP32;
  ASSERT_TRUE(Settle(ops().Pack({pa, pb}, staging->data())).ok());
  exec::UnpackItem ua, ub;
  ua.staging_offset = 256;
  ua.wire_dtype = v1::BF16;
  ua.dst = View2D(dst_a.get(), v1::FP32, kRows, kCols, kCols, 1);
  ub.staging_offset = 512;
  ub.wire_dtype = v1::FP32;
  ub.dst = View2D(dst_b.get(), v1::FP32, kRows, kCols, kCols, 1);
  ASSERT_TRUE(Settle(ops().Unpack(staging->data(), {ua, ub})).ok());
  const std::vector<uint8_t> a = Download(dst_a.get(), sentinel.size());
  const std::vector<uint8_t> b = Download(dst_b.get(), sentinel.size());
  for (int64_t r = 0; r < kRows; ++r) {
    for (int64_t c = 0; c < kCols; ++c) {
      const uint8_t* s = At(src_host, 4, r, c, kPitch, 1);
      uint8_t wire[2];
      float want_a;
      ASSERT_TRUE(ConvertElements(s, v1::FP32, wire, v1::BF16, 1).ok());
      ASSERT_TRUE(ConvertElements(wire, v1::BF16, &want_a, v1::FP32, 1).ok());
      EXPECT_EQ(std::memcmp(At(a, 4, r, c, kCols, 1), &want_a, 4), 0) << r << "," << c;
      EXPECT_EQ(std::memcmp(At(b, 4, r, c, kCols, 1), s, 4), 0) << r << "," << c;
    }
  }
}

// Calls run in call order without a wait between them: a copy reads what the
// copy before it wrote.
TEST_P(DataOpsConformanceTest, CallsRunInCallOrderWithoutWaits) {
  constexpr int64_t kN = 1 << 14;
  const std::vector<uint8_t> a_host = CastFrom(TestFloats(kN, 3), v1::FP32);
  std::vector<uint8_t> zeros(kN * 4, 0);
  auto a = Upload(a_host);
  auto b = Upload(zeros);
  auto c = Upload(zeros);
  const exec::CopyItem ab{View2D(a.get(), v1::FP32, 1, kN, kN, 1),
                          View2D(b.get(), v1::FP32, 1, kN, kN, 1)};
  const exec::CopyItem bc{View2D(b.get(), v1::FP32, 1, kN, kN, 1),
                          View2D(c.get(), v1::FP32, 1, kN, kN, 1)};
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(ops().Copy({ab}).ok());
    ASSERT_TRUE(ops().Copy({bc}).ok());
  }
  ASSERT_TRUE(ops().Synchronize().ok());
  EXPECT_EQ(Download(c.get(), zeros.size()), a_host);
}

// A prepared list gets a handle of its own; a copy given it reads the bytes
// as they are at that call (a replay never reuses old data).
TEST_P(DataOpsConformanceTest, PreparedListsReplayOnTheCurrentBytes) {
  constexpr int64_t kRows = 6, kCols = 10, kPitch = 12;
  std::vector<uint8_t> sentinel(kRows * kCols * 2, 0xEE);
  auto src = Upload(CastFrom(TestFloats(kRows * kPitch, 5), v1::FP32));
  auto dst = Upload(sentinel);
  const std::vector<exec::CopyItem> items = {{View2D(src.get(), v1::FP32, kRows, kCols, kPitch, 1),
                                              View2D(dst.get(), v1::BF16, kRows, kCols, kCols, 1)}};
  const std::vector<exec::CopyItem> other = {{View2D(src.get(), v1::FP32, 1, kCols, kPitch, 1),
                                              View2D(dst.get(), v1::BF16, 1, kCols, kCols, 1)}};
  const exec::ItemsHandle h = ops().Prepare(items);
  const exec::ItemsHandle h2 = ops().Prepare(other);
  EXPECT_NE(h.id, 0u);
  EXPECT_NE(h.id, h2.id);
  for (uint32_t seed : {21u, 22u, 23u}) {
    const std::vector<uint8_t> fresh = CastFrom(TestFloats(kRows * kPitch, seed), v1::FP32);
    factory().Write(src.get(), fresh.data(), fresh.size());
    ASSERT_TRUE(Settle(ops().Copy(items, h)).ok());
    const std::vector<uint8_t> got = Download(dst.get(), sentinel.size());
    for (int64_t r = 0; r < kRows; ++r) {
      for (int64_t c = 0; c < kCols; ++c) {
        uint8_t want[2];
        ASSERT_TRUE(
            ConvertElements(At(fresh, 4, r, c, kPitch, 1), v1::FP32, want, v1::BF16, 1).ok());
        ASSERT_EQ(std::memcmp(At(got, 2, r, c, kCols, 1), want, 2), 0)
            << "seed " << seed << " element (" << r << ", " << c << ")";
      }
    }
  }
}

// dst = SUM over inputs converted to the accumulate dtype (fp32, in input
// order, one rounding), converted to dst's dtype; inputs strided or staged.
TEST_P(DataOpsConformanceTest, ReduceMatchesReduceElements) {
  constexpr int64_t kN = 96;
  std::vector<std::vector<uint8_t>> in_host;
  std::vector<std::shared_ptr<uint8_t>> in_mem;
  for (uint32_t k = 0; k < 3; ++k) {
    in_host.push_back(CastFrom(TestFloats(kN * 2, 40 + k), v1::BF16));
    in_mem.push_back(Upload(in_host.back()));
  }
  auto staging = ops().AllocateStaging(kN * 2);
  ASSERT_TRUE(staging.ok()) << staging.status();
  // Input 2 is staged: its first kN elements, packed.
  factory().Write(staging->data(), in_host[2].data(), kN * 2);
  std::vector<uint8_t> sentinel(kN * 2, 0xEE);
  auto dst = Upload(sentinel);
  std::vector<exec::ReduceInput> inputs(3);
  inputs[0].view = View2D(in_mem[0].get(), v1::BF16, 1, kN, kN, 2);  // every other element
  inputs[1].view = View2D(in_mem[1].get(), v1::BF16, 1, kN, kN, 1);
  inputs[2].view = View2D(nullptr, v1::BF16, 1, kN, kN, 1);
  inputs[2].staging_offset = 0;
  exec::ReduceItem item;
  item.op = v1::REDUCE_SUM;
  item.accumulate_dtype = v1::FP32;
  item.dst = View2D(dst.get(), v1::BF16, 1, kN, kN, 1);
  item.input_begin = 0;
  item.num_inputs = 3;
  ASSERT_TRUE(Settle(ops().Reduce(inputs, {item}, staging->data())).ok());
  std::vector<float> f[3];
  for (int k = 0; k < 3; ++k) f[k].resize(kN);
  for (int64_t i = 0; i < kN; ++i) {
    ASSERT_TRUE(ConvertElements(in_host[0].data() + 4 * i, v1::BF16, &f[0][i], v1::FP32, 1).ok());
  }
  ASSERT_TRUE(ConvertElements(in_host[1].data(), v1::BF16, f[1].data(), v1::FP32, kN).ok());
  ASSERT_TRUE(ConvertElements(in_host[2].data(), v1::BF16, f[2].data(), v1::FP32, kN).ok());
  std::vector<float> sum(kN);
  const void* ptrs[] = {f[0].data(), f[1].data(), f[2].data()};
  ASSERT_TRUE(ReduceElements(ptrs, v1::FP32, v1::REDUCE_SUM, sum.data(), kN).ok());
  std::vector<uint8_t> want(kN * 2);
  ASSERT_TRUE(ConvertElements(sum.data(), v1::FP32, want.data(), v1::BF16, kN).ok());
  EXPECT_EQ(Download(dst.get(), want.size()), want);
}

// A bad item fails the call (at issue or at Synchronize) with an error that
// names it: "copy item <i>" and ErrorItemIndex.
TEST_P(DataOpsConformanceTest, ErrorsNameTheItem) {
  std::vector<uint8_t> zeros(64 * 4, 0);
  auto a = Upload(zeros);
  auto b = Upload(zeros);
  const exec::CopyItem good{View2D(a.get(), v1::FP32, 1, 64, 64, 1),
                            View2D(b.get(), v1::FP32, 1, 64, 64, 1)};
  exec::CopyItem mismatched = good;
  mismatched.dst.shape[1] = 32;  // element counts differ
  const absl::Status s = Settle(ops().Copy({good, mismatched}));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(exec::ErrorItemIndex(s), 1) << s;
  EXPECT_NE(s.message().find("item 1"), std::string::npos) << s;
  // The ops stay usable.
  EXPECT_TRUE(Settle(ops().Copy({good})).ok());
}

// A direct-write bucket's checksum from its views (QueueWireChecksum) is the
// chunk_hash of the bucket image: every item's elements converted as on the
// wire (strided, cast, through an intermediate dtype), at offsets that cut
// words, with zero bytes in the gaps and a partial last word; and, where the
// items tile the bucket, the checksum of the bucket packed into staging (what
// a transport bucket's sender and receiver hash).
TEST_P(DataOpsConformanceTest, WireChecksumOfViewsIsTheHashOfTheBucketImage) {
  struct Spec {
    DType src, via, wire;
    int64_t rows, cols, row_stride, col_stride, offset;
  };
  const std::vector<Spec> specs = {
      {v1::FP32, v1::DTYPE_UNSPECIFIED, v1::BF16, 3, 5, 7, 1, 0},      // strided, cast: 30 bytes
      {v1::BF16, v1::DTYPE_UNSPECIFIED, v1::BF16, 1, 13, 13, 1, 30},   // raw, cuts words
      {v1::FP32, v1::BF16, v1::FP32, 3, 4, 1, 3, 56},                  // transposed, via bf16
      {v1::FP16, v1::DTYPE_UNSPECIFIED, v1::FP16, 1, 7, 7, 1, 108},    // after a 4-byte gap
      {v1::FP32, v1::DTYPE_UNSPECIFIED, v1::FP32, 1, 64, 64, 1, 124},  // raw, words off by 4
      {v1::FP32, v1::DTYPE_UNSPECIFIED, v1::FP32, 1, 32, 32, 1, 392},  // raw, 8-byte aligned
  };
  // A gap at 380 holding a whole zero word, 3 zero bytes after the last item.
  constexpr int64_t kBucket = 523;
  std::vector<std::vector<uint8_t>> host;
  std::vector<std::shared_ptr<uint8_t>> mem;
  std::vector<exec::WireHashItem> items;
  std::vector<uint8_t> image(kBucket, 0);
  for (size_t i = 0; i < specs.size(); ++i) {
    const Spec& sp = specs[i];
    const int64_t n = (sp.rows - 1) * sp.row_stride + (sp.cols - 1) * sp.col_stride + 1;
    host.push_back(CastFrom(TestFloats(static_cast<size_t>(n), 20 + i), sp.src));
    mem.push_back(Upload(host.back()));
    exec::WireHashItem it;
    it.view = View2D(mem.back().get(), sp.src, sp.rows, sp.cols, sp.row_stride, sp.col_stride);
    it.via = sp.via;
    it.wire_dtype = sp.wire;
    it.bucket_offset = sp.offset;
    items.push_back(it);
    const DType mid = sp.via != v1::DTYPE_UNSPECIFIED ? sp.via : sp.src;
    const int64_t ws = DTypeSize(sp.wire);
    for (int64_t r = 0, e = 0; r < sp.rows; ++r) {
      for (int64_t c = 0; c < sp.cols; ++c, ++e) {
        uint8_t a[8] = {}, b[8] = {};
        std::memcpy(a, At(host.back(), DTypeSize(sp.src), r, c, sp.row_stride, sp.col_stride),
                    DTypeSize(sp.src));
        if (mid != sp.src) {
          ASSERT_TRUE(ConvertElements(a, sp.src, b, mid, 1).ok());
        }
        const uint8_t* m = mid != sp.src ? b : a;
        uint8_t w[8] = {};
        if (sp.wire != mid) {
          ASSERT_TRUE(ConvertElements(m, mid, w, sp.wire, 1).ok());
          m = w;
        }
        std::memcpy(image.data() + sp.offset + e * ws, m, ws);
      }
    }
  }
  // The first two items tile bytes [0, 56): packed as a transport bucket.
  auto staging = ops().AllocateStaging(256);
  ASSERT_TRUE(staging.ok()) << staging.status();
  exec::PackItem pa, pb;
  pa.src = items[0].view;
  pa.staging_offset = 0;
  pa.wire_dtype = v1::BF16;
  pb.src = items[1].view;
  pb.staging_offset = 30;
  pb.wire_dtype = v1::BF16;
  ASSERT_TRUE(Settle(ops().Pack({pa, pb}, staging->data())).ok());
  auto packed = ops().Checksum(staging->data(), 56);
  ASSERT_TRUE(packed.ok()) << packed.status();
  EXPECT_EQ(*packed, chunk_hash::Hash(image.data(), 56)) << "reference image and pack disagree";

  const std::vector<exec::WireHashItem> prefix(items.begin(), items.begin() + 2);
  const exec::ItemsHandle h = ops().PrepareWireHash(items);
  ASSERT_TRUE(ops().ResetChecksums(4).ok());
  ASSERT_TRUE(ops().QueueWireChecksum(items, kBucket, 0, h).ok());
  ASSERT_TRUE(ops().QueueWireChecksum(prefix, 56, 1).ok());
  ASSERT_TRUE(ops().QueueWireChecksum(items, kBucket, 2, h).ok());  // replayed by handle
  auto got = ops().CollectChecksums();
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 4u);
  EXPECT_EQ((*got)[0], chunk_hash::Hash(image.data(), kBucket));
  EXPECT_EQ((*got)[1], *packed) << "views and the packed bucket hash alike";
  EXPECT_EQ((*got)[2], (*got)[0]);

  // Items that overlap are refused, naming the item.
  std::vector<exec::WireHashItem> bad = prefix;
  bad[1].bucket_offset = 28;
  ASSERT_TRUE(ops().ResetChecksums(1).ok());
  const absl::Status s = Settle(ops().QueueWireChecksum(bad, 56, 0));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("item 1"), std::string::npos) << s;
}

// The same for buckets of large raw items, so that a device hashes whole
// chunks of them (cuda/wire_hash_kernel.cu: 16 KiB a block, 16- and 8-byte
// loads) beside chunks across items and an item at an odd offset (word by
// word): bf16 from an aligned allocation, fp32 starting 8 bytes into one,
// bf16 at an odd bucket offset, zero bytes to the end.
TEST_P(DataOpsConformanceTest, WireChecksumOfLargeRawItemsIsTheHashOfTheBucketImage) {
  struct Spec {
    DType dtype;
    int64_t elements, skip, offset;  // skip: elements before the view's first
  };
  const std::vector<Spec> specs = {
      {v1::BF16, 40000, 0, 0}, {v1::FP32, 20000, 2, 80000}, {v1::BF16, 30001, 0, 160003}};
  constexpr int64_t kBucket = 220016;
  std::vector<std::shared_ptr<uint8_t>> mem;
  std::vector<exec::WireHashItem> items;
  std::vector<uint8_t> image(kBucket, 0);
  for (size_t i = 0; i < specs.size(); ++i) {
    const Spec& sp = specs[i];
    const int64_t es = DTypeSize(sp.dtype);
    const std::vector<uint8_t> host =
        CastFrom(TestFloats(static_cast<size_t>(sp.elements + sp.skip), 40 + i), sp.dtype);
    mem.push_back(Upload(host));
    exec::WireHashItem it;
    it.view = View2D(mem.back().get() + sp.skip * es, sp.dtype, 1, sp.elements, sp.elements, 1);
    it.wire_dtype = sp.dtype;
    it.bucket_offset = sp.offset;
    items.push_back(it);
    std::memcpy(image.data() + sp.offset, host.data() + sp.skip * es,
                static_cast<size_t>(sp.elements * es));
  }
  const exec::ItemsHandle h = ops().PrepareWireHash(items);
  ASSERT_TRUE(ops().ResetChecksums(2).ok());
  ASSERT_TRUE(ops().QueueWireChecksum(items, kBucket, 0, h).ok());
  ASSERT_TRUE(ops().QueueWireChecksum(items, kBucket, 1).ok());
  auto got = ops().CollectChecksums();
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 2u);
  EXPECT_EQ((*got)[0], chunk_hash::Hash(image.data(), kBucket));
  EXPECT_EQ((*got)[1], (*got)[0]);
}

}  // namespace wsync::plane::conformance

#endif  // WSYNC_TESTS_WORKER_PLANE_DATA_OPS_CONFORMANCE_H_
