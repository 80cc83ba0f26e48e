// Pages, page tables and pools (DESIGN §2): page 0 is reserved and zero, accounting is exact,
// exhaustion is an answer and not a corruption.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/expect_error.h"
#include "common/test_util.h"
#include "dsa/backend.h"
#include "dsa/cache.h"
#include "dsa/error.h"

namespace dsa {
namespace {

using ::dsa::testing::kPoisonByte;
using ::dsa::testing::Rng;

using ::dsa::testing::expect_error;

void expect_accounting(const PageAllocator& a, int64_t expected_used) {
  ASSERT_EQ(a.free_pages() + a.used_pages(), a.total_pages() - 1);
  ASSERT_EQ(a.used_pages(), expected_used);
}

TEST(Allocator, FreshAllocatorHandsOutEveryPageButZero) {
  PageAllocator a(9);
  expect_accounting(a, 0);
  std::set<int32_t> seen;
  for (int i = 0; i < 8; ++i) {
    const auto page = a.allocate();
    ASSERT_TRUE(page.has_value());
    EXPECT_GE(*page, 1);
    EXPECT_LT(*page, 9);
    EXPECT_TRUE(seen.insert(*page).second) << "page " << *page << " handed out twice";
  }
  EXPECT_EQ(seen.size(), 8u);
  expect_accounting(a, 8);
}

TEST(Allocator, ExhaustionReturnsNulloptAndChangesNothing) {
  PageAllocator a(5);
  std::vector<int32_t> held;
  ASSERT_TRUE(a.allocate_n(4, held));
  expect_accounting(a, 4);
  for (int i = 0; i < 3; ++i) {
    EXPECT_FALSE(a.allocate().has_value());
    expect_accounting(a, 4);
  }
  // A released page is the only page available again.
  a.release(held[2]);
  const auto again = a.allocate();
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(*again, held[2]);
  EXPECT_FALSE(a.allocate().has_value());
}

TEST(Allocator, AllocateNIsAllOrNothing) {
  PageAllocator a(11);                  // 10 usable pages
  std::vector<int32_t> out = {77, 78};  // allocate_n appends; existing entries are kept
  ASSERT_TRUE(a.allocate_n(7, out));
  ASSERT_EQ(out.size(), 9u);
  EXPECT_EQ(out[0], 77);
  expect_accounting(a, 7);

  const std::vector<int32_t> before = out;
  EXPECT_FALSE(a.allocate_n(4, out));  // 3 free: takes none
  EXPECT_EQ(out, before);
  expect_accounting(a, 7);

  EXPECT_TRUE(a.allocate_n(0, out));
  EXPECT_EQ(out, before);
  ASSERT_TRUE(a.allocate_n(3, out));  // exactly the rest
  expect_accounting(a, 10);
  expect_error([&] { a.allocate_n(-1, out); }, ErrorCode::kInvalidArgument, {"-1"});
}

TEST(Allocator, BadReleasesThrowNamingThePageAndChangeNothing) {
  PageAllocator a(6);
  const int32_t page = *a.allocate();
  const int32_t never_allocated = *a.allocate() + 1;
  expect_accounting(a, 2);
  expect_error([&] { a.release(0); }, ErrorCode::kInvalidArgument, {"page 0", "reserved"});
  expect_error([&] { a.release(-3); }, ErrorCode::kInvalidArgument, {"page -3"});
  expect_error([&] { a.release(6); }, ErrorCode::kInvalidArgument, {"page 6", "6)"});
  expect_error([&] { a.release(never_allocated); }, ErrorCode::kInvalidArgument,
               {"page " + std::to_string(never_allocated), "double free"});
  expect_accounting(a, 2);
  a.release(page);
  expect_accounting(a, 1);
  expect_error([&] { a.release(page); }, ErrorCode::kInvalidArgument,
               {"page " + std::to_string(page), "double free"});
  expect_accounting(a, 1);
}

TEST(Allocator, RejectsFewerThanTwoPages) {
  for (const int64_t total : {1, 0, -4}) {
    expect_error([&] { PageAllocator a(total); }, ErrorCode::kInvalidArgument,
                 {"total_pages", std::to_string(total)});
  }
}

// Thousands of random operations against a shadow set of held pages, checking the invariant
// after every one.
TEST(Allocator, RandomSequencesKeepExactAccounting) {
  for (const uint64_t seed : {1u, 2u, 3u}) {
    Rng rng(seed);
    const int64_t total = rng.integer(2, 120);
    PageAllocator a(total);
    std::vector<int32_t> held;
    std::set<int32_t> held_set;
    for (int op = 0; op < 4000; ++op) {
      const int64_t kind = rng.integer(0, 5);
      if (kind <= 1) {  // allocate one
        const auto page = a.allocate();
        ASSERT_EQ(page.has_value(), int64_t(held.size()) < total - 1) << "op " << op;
        if (page) {
          ASSERT_NE(*page, kReservedPage);
          ASSERT_TRUE(held_set.insert(*page).second) << "page " << *page << " handed out twice";
          held.push_back(*page);
        }
      } else if (kind == 2) {  // allocate several, all-or-nothing
        const int64_t n = rng.integer(0, 12);
        std::vector<int32_t> out;
        const bool ok = a.allocate_n(n, out);
        ASSERT_EQ(ok, n <= total - 1 - int64_t(held.size())) << "op " << op;
        ASSERT_EQ(int64_t(out.size()), ok ? n : 0);
        for (const int32_t page : out) {
          ASSERT_NE(page, kReservedPage);
          ASSERT_TRUE(held_set.insert(page).second) << "page " << page << " handed out twice";
          held.push_back(page);
        }
      } else if (!held.empty()) {  // release a random held page
        const size_t i = size_t(rng.integer(0, int64_t(held.size()) - 1));
        a.release(held[i]);
        held_set.erase(held[i]);
        held[i] = held.back();
        held.pop_back();
      }
      expect_accounting(a, int64_t(held.size()));
      // The store check's fast test agrees with the states: only held pages may be written.
      for (int64_t page = -1; page <= total; ++page) {
        ASSERT_EQ(a.owned(page), held_set.count(int32_t(page)) == 1) << "page " << page;
      }
    }
  }
}

TEST(PageTable, ReserveMapsPositionsToSlotsThroughItsPages) {
  PageAllocator a(10);
  a.allocate();  // so the table's pages are not simply 1, 2, ...
  PageTable t;
  EXPECT_EQ(t.capacity_tokens(), 0);
  ASSERT_TRUE(t.reserve(65, a));
  ASSERT_EQ(t.pages().size(), 2u);
  EXPECT_EQ(t.capacity_tokens(), 128);
  ASSERT_TRUE(t.reserve(100, a));  // fits in the pages already held
  EXPECT_EQ(t.pages().size(), 2u);
  ASSERT_TRUE(t.reserve(129, a));
  ASSERT_EQ(t.pages().size(), 3u);
  for (const int64_t pos : {0, 1, 63, 64, 127, 128, 191}) {
    const int64_t page = t.pages()[size_t(pos / kPageSize)];
    EXPECT_NE(page, kReservedPage);
    EXPECT_EQ(t.slot(pos), page * kPageSize + pos % kPageSize) << "position " << pos;
  }
  expect_accounting(a, 4);
}

TEST(PageTable, SlotPastTheReservedTokensThrowsNamingPositionAndCapacity) {
  PageAllocator a(4);
  PageTable t;
  expect_error([&] { t.slot(0); }, ErrorCode::kOutOfRange, {"position 0", " 0 reserved"});
  ASSERT_TRUE(t.reserve(10, a));
  expect_error([&] { t.slot(64); }, ErrorCode::kOutOfRange, {"position 64", "64 reserved"});
  expect_error([&] { t.slot(-1); }, ErrorCode::kOutOfRange, {"position -1", "64 reserved"});
}

TEST(PageTable, ExhaustionLeavesTableAndAllocatorUnchanged) {
  PageAllocator a(5);  // 4 usable pages
  PageTable t;
  ASSERT_TRUE(t.reserve(2 * kPageSize, a));
  const std::vector<int32_t> pages = t.pages();
  expect_accounting(a, 2);
  EXPECT_FALSE(t.reserve(5 * kPageSize, a));  // needs 3 more, 2 are free
  EXPECT_EQ(t.pages(), pages);
  expect_accounting(a, 2);
  EXPECT_EQ(t.slot(2 * kPageSize - 1), int64_t(pages[1]) * kPageSize + kPageSize - 1);
  ASSERT_TRUE(t.reserve(4 * kPageSize, a));  // exactly what is left
  expect_accounting(a, 4);
}

TEST(PageTable, ReleaseAllReturnsEveryPage) {
  PageAllocator a(8);
  PageTable t1, t2;
  ASSERT_TRUE(t1.reserve(3 * kPageSize, a));
  ASSERT_TRUE(t2.reserve(kPageSize + 1, a));
  expect_accounting(a, 5);
  t1.release_all(a);
  EXPECT_TRUE(t1.pages().empty());
  EXPECT_EQ(t1.capacity_tokens(), 0);
  expect_accounting(a, 2);
  ASSERT_TRUE(t1.reserve(5 * kPageSize, a));  // the released pages serve again
  expect_accounting(a, 7);
  t2.release_all(a);
  t1.release_all(a);
  expect_accounting(a, 0);
}

// The CPU backend, except that every allocation starts as poison, so a pool that is not
// zero-filled shows. It forwards every other call, so it tracks the Backend interface.
class PoisoningBackend final : public Backend {
 public:
  PoisoningBackend() : cpu_(make_cpu_backend()) {}
  BackendKind kind() const override { return cpu_->kind(); }
  std::string describe() const override { return "poisoning " + cpu_->describe(); }
  void* allocate(size_t bytes) override {
    void* p = cpu_->allocate(bytes);
    cpu_->fill(p, kPoisonByte, bytes);
    allocation_bytes.push_back(bytes);
    return p;
  }
  void deallocate(void* p) override { cpu_->deallocate(p); }
  void copy_to_device(void* d, const void* s, size_t n) override { cpu_->copy_to_device(d, s, n); }
  void copy_to_host(void* d, const void* s, size_t n) override { cpu_->copy_to_host(d, s, n); }
  void copy_on_device(void* d, const void* s, size_t n) override { cpu_->copy_on_device(d, s, n); }
  void fill(void* d, uint8_t byte, size_t n) override { cpu_->fill(d, byte, n); }
  void synchronize() override { cpu_->synchronize(); }
  std::unique_ptr<Graph> capture(const std::function<void()>& step) override {
    return cpu_->capture(step);
  }
  void rmsnorm(const RmsNormParams& p) override { cpu_->rmsnorm(p); }
  void layernorm(const LayerNormParams& p) override { cpu_->layernorm(p); }
  void rope(const RopeParams& p) override { cpu_->rope(p); }
  void hadamard(const HadamardParams& p) override { cpu_->hadamard(p); }
  void gemm(const GemmParams& p) override { cpu_->gemm(p); }
  void swiglu(const SwigluParams& p) override { cpu_->swiglu(p); }
  void softmax(const SoftmaxParams& p) override { cpu_->softmax(p); }
  void embed(const EmbedParams& p) override { cpu_->embed(p); }
  void add(const AddParams& p) override { cpu_->add(p); }
  void copy_rows(const CopyRowsParams& p) override { cpu_->copy_rows(p); }
  void moe_route(const MoeRouteParams& p) override { cpu_->moe_route(p); }
  void scale_rows(const ScaleRowsParams& p) override { cpu_->scale_rows(p); }
  void store_index_k(const StoreIndexKParams& p) override { cpu_->store_index_k(p); }
  void store_latent_kv(const StoreLatentKvParams& p) override { cpu_->store_latent_kv(p); }
  void indexer_key(const IndexerKeyParams& p) override { cpu_->indexer_key(p); }
  void indexer_query(const IndexerQueryParams& p) override { cpu_->indexer_query(p); }
  void latent_kv(const LatentKvParams& p) override { cpu_->latent_kv(p); }
  void indexer_logits(const IndexerLogitsParams& p) override { cpu_->indexer_logits(p); }
  void topk(const TopkParams& p) override { cpu_->topk(p); }
  void sparse_mla(const SparseMlaParams& p) override { cpu_->sparse_mla(p); }
  void audit_slots(const AuditSlotsParams& p) override { cpu_->audit_slots(p); }
  void sample(const SampleParams& p) override { cpu_->sample(p); }
  void digest_rows(const DigestRowsParams& p) override { cpu_->digest_rows(p); }
  void audit_sample(const AuditSampleParams& p) override { cpu_->audit_sample(p); }

  std::vector<size_t> allocation_bytes;  // in allocation order

 private:
  std::unique_ptr<Backend> cpu_;
};

bool all_zero(const uint8_t* p, int64_t n) {
  return std::all_of(p, p + n, [](uint8_t b) { return b == 0; });
}

TEST(KvCache, PoolsHaveTheirLayoutSizeAndAreZeroFilled) {
  for (const KvDtype latent : {KvDtype::kBf16, KvDtype::kFp8}) {
    for (const KvDtype index_k : {KvDtype::kBf16, KvDtype::kFp8}) {
      SCOPED_TRACE(std::string("latent ") + kv_dtype_name(latent) + ", index-K " +
                   kv_dtype_name(index_k));
      PoisoningBackend backend;
      const CacheConfig config{.num_layers = 3,
                               .num_pages = 5,
                               .latent_dtype = latent,
                               .index_k_dtype = index_k,
                               .fp8_scale_rounding = ScaleRounding::kUe8m0};
      KvCache cache(backend, config);
      EXPECT_EQ(backend.allocation_bytes.size(), 6u);
      EXPECT_EQ(cache.capacity_slots(), 5 * kPageSize);
      EXPECT_EQ(cache.allocator().total_pages(), 5);
      EXPECT_EQ(cache.allocator().free_pages(), 4);
      std::set<const uint8_t*> distinct;
      for (int layer = 0; layer < 3; ++layer) {
        const PoolView l = cache.latent(layer), k = cache.index_k(layer);
        EXPECT_EQ(l.dtype, latent);
        EXPECT_EQ(k.dtype, index_k);
        EXPECT_EQ(l.num_pages, 5);
        EXPECT_EQ(k.num_pages, 5);
        EXPECT_EQ(l.rounding, ScaleRounding::kUe8m0);
        EXPECT_EQ(k.capacity(), cache.capacity_slots());
        // Page 0 first (the reserved page every padded row reads), then the whole pool.
        EXPECT_TRUE(all_zero(l.data, latent_page_bytes(latent)));
        EXPECT_TRUE(all_zero(k.data, index_k_page_bytes(index_k)));
        EXPECT_TRUE(all_zero(l.data, 5 * latent_page_bytes(latent)));
        EXPECT_TRUE(all_zero(k.data, 5 * index_k_page_bytes(index_k)));
        distinct.insert(l.data);
        distinct.insert(k.data);
      }
      EXPECT_EQ(distinct.size(), 6u);
      for (size_t i = 0; i < backend.allocation_bytes.size(); ++i) {
        const int64_t page_bytes =
            i % 2 == 0 ? latent_page_bytes(latent) : index_k_page_bytes(index_k);
        EXPECT_EQ(backend.allocation_bytes[i], size_t(5 * page_bytes)) << "allocation " << i;
      }
    }
  }
}

TEST(KvCache, RejectsBadConfigWithClearErrors) {
  auto backend = make_cpu_backend();
  expect_error([&] { KvCache c(*backend, CacheConfig{.num_layers = 0}); },
               ErrorCode::kInvalidArgument, {"num_layers", "got 0"});
  expect_error([&] { KvCache c(*backend, CacheConfig{.num_layers = 2, .num_pages = 1}); },
               ErrorCode::kInvalidArgument, {"num_pages", "got 1"});
  expect_error([&] { KvCache c(*backend, CacheConfig{.num_layers = 2, .num_pages = -5}); },
               ErrorCode::kInvalidArgument, {"num_pages", "got -5"});
}

TEST(KvCache, LayerOutsideTheCacheThrows) {
  auto backend = make_cpu_backend();
  const KvCache cache(*backend, CacheConfig{.num_layers = 2, .num_pages = 3});
  expect_error([&] { cache.latent(2); }, ErrorCode::kOutOfRange, {"layer 2", "2 layers"});
  expect_error([&] { cache.index_k(-1); }, ErrorCode::kOutOfRange, {"layer -1", "2 layers"});
}

}  // namespace
}  // namespace dsa
