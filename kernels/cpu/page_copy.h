// Moving a sequence's KV pages between the paged pool and a packed copy (prefix-cache
// checkpoints, snapshots): the CPU reference of kernels/cuda/page_copy.cuh.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>

namespace ds::cpu {

// For each pool i and list entry j: the page_bytes at pools[i] + pages[j] * page_bytes and those
// at packed[i] + j * page_bytes; `to_packed` copies pool -> packed, else packed -> pool.
// pools.size() == packed.size().
void CopyPages(std::span<uint8_t* const> pools, std::span<uint8_t* const> packed,
               std::span<const int32_t> pages, size_t page_bytes, bool to_packed);

}  // namespace ds::cpu
