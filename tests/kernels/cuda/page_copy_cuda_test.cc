// A sequence's KV pages between the paged pool and a packed copy (kernels/cuda/page_copy.cuh)
// against the CPU reference (kernels/cpu/page_copy.h). Needs a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <random>
#include <vector>

#include "kernels/cpu/page_copy.h"
#include "kernels/cuda/page_copy.cuh"
#include "tests/kernels/cuda/cuda_test_util.h"

namespace ds::cuda {
namespace {

// Both directions, 16-byte and byte-wise pages, pages in a scattered order: the kernel moves
// exactly the bytes the CPU reference moves, and nothing else of the pools.
TEST(PageCopy, MatchesCpu) {
  std::mt19937 rng(77);
  for (const size_t page_bytes : {size_t{4096}, size_t{100}}) {
    const int n_pools = 5, pool_pages = 40, n_pages = 17;
    std::vector<int32_t> pages(pool_pages);
    for (int i = 0; i < pool_pages; ++i) pages[i] = i;
    std::shuffle(pages.begin(), pages.end(), rng);
    pages.resize(n_pages);
    std::uniform_int_distribution<int> byte(0, 255);
    std::vector<std::vector<uint8_t>> h_pool(n_pools), h_packed(n_pools);
    for (int i = 0; i < n_pools; ++i) {
      h_pool[i].resize(pool_pages * page_bytes);
      h_packed[i].resize(n_pages * page_bytes);
      for (auto& b : h_pool[i]) b = static_cast<uint8_t>(byte(rng));
      for (auto& b : h_packed[i]) b = static_cast<uint8_t>(byte(rng));
    }
    for (const bool to_packed : {true, false}) {
      std::vector<std::unique_ptr<Dev<uint8_t>>> d_pool, d_packed;
      PageCopyArgs a;
      a.n_pools = n_pools;
      a.n_pages = n_pages;
      a.page_bytes = page_bytes;
      a.to_packed = to_packed;
      Dev<int32_t> d_pages(pages);
      a.pages = d_pages.p;
      std::vector<uint8_t*> ref_pool(n_pools), ref_packed(n_pools);
      auto r_pool = h_pool, r_packed = h_packed;
      for (int i = 0; i < n_pools; ++i) {
        d_pool.push_back(std::make_unique<Dev<uint8_t>>(h_pool[i]));
        d_packed.push_back(std::make_unique<Dev<uint8_t>>(h_packed[i]));
        a.pool[i] = d_pool[i]->p;
        a.packed[i] = d_packed[i]->p;
        ref_pool[i] = r_pool[i].data();
        ref_packed[i] = r_packed[i].data();
      }
      ASSERT_OK(CopyPages(a, nullptr));
      cpu::CopyPages(ref_pool, ref_packed, pages, page_bytes, to_packed);
      for (int i = 0; i < n_pools; ++i) {
        EXPECT_EQ(d_pool[i]->Down(), r_pool[i]) << "pool " << i << " page_bytes " << page_bytes;
        EXPECT_EQ(d_packed[i]->Down(), r_packed[i]) << "packed " << i << " page_bytes " << page_bytes;
      }
      // The copy really moved data in the direction asked (the reference changed something).
      EXPECT_NE(to_packed ? r_packed[0] : r_pool[0], to_packed ? h_packed[0] : h_pool[0]);
    }
  }
  PageCopyArgs bad;
  bad.n_pools = kPageCopyMaxPools + 1;
  EXPECT_FALSE(CopyPages(bad, nullptr).ok());
}

}  // namespace
}  // namespace ds::cuda
