// What the GDN kernel files share (gdn.cu: prefill; gdn_decode.cu: decode): the conv width, a
// non-negative modulo, the block width rounded to a warp and the dispatch over the key head dim.
// Internal to those files (an unnamed namespace: each has its own copy).
#pragma once
#include <type_traits>

namespace ds::cuda {
namespace {

constexpr int kConvK = 4;

__device__ __forceinline__ int Mod(int a, int m) { return ((a % m) + m) % m; }

constexpr int WarpRound(int n) { return (n + 31) / 32 * 32; }

template <typename F>
bool DispatchDk(int dk, F&& f) {  // f(std::integral_constant<int, DK>{}): C++17, see DispatchType
  switch (dk) {
    case 16:
      f(std::integral_constant<int, 16>{});
      return true;
    case 32:
      f(std::integral_constant<int, 32>{});
      return true;
    case 64:
      f(std::integral_constant<int, 64>{});
      return true;
    case 128:
      f(std::integral_constant<int, 128>{});
      return true;
    default:
      return false;
  }
}

}  // namespace
}  // namespace ds::cuda
