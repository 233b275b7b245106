#include "kernels/cpu/page_copy.h"

#include <cstring>

namespace ds::cpu {

void CopyPages(std::span<uint8_t* const> pools, std::span<uint8_t* const> packed,
               std::span<const int32_t> pages, size_t page_bytes, bool to_packed) {
  for (size_t i = 0; i < pools.size(); ++i)
    for (size_t j = 0; j < pages.size(); ++j) {
      uint8_t* in_pool = pools[i] + static_cast<size_t>(pages[j]) * page_bytes;
      uint8_t* in_packed = packed[i] + j * page_bytes;
      if (to_packed) std::memcpy(in_packed, in_pool, page_bytes);
      else std::memcpy(in_pool, in_packed, page_bytes);
    }
}

}  // namespace ds::cpu
