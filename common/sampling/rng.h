// Deterministic pseudo-random numbers for sampling: counter-based uniforms (UniformAt, what the
// sampler draws) and a xoshiro256** stream seeded through splitmix64 (Rng, for tests and benches).
// Both algorithms are fully specified integer arithmetic (Blackman & Vigna), so a given seed yields
// the same stream on every compiler, standard library and platform. std:: distributions are not
// used anywhere in sampling because their output is implementation-defined.
#pragma once
#include <cstdint>

namespace ds::sampling {

// One splitmix64 step: advances `state` and returns the mixed output.
inline uint64_t SplitMix64(uint64_t& state) {
  state += 0x9e3779b97f4a7c15ULL;
  uint64_t z = state;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// The uniform in [0, 1) (53 random bits) of draw `counter` of the stream named `seed`, computed
// directly: element `counter` of the splitmix64 sequence that starts from a mix of the seed (the
// mix keeps nearby seeds, 1, 2, 3, from naming shifted copies of one sequence). The sampler keys
// its draws by the token's position in the sequence, so the token at position p takes the same
// uniform however it is reached: plain decoding, a speculative verify, a replay after failover.
inline double UniformAt(uint64_t seed, uint64_t counter) {
  uint64_t key = seed;
  uint64_t state = SplitMix64(key) + counter * 0x9e3779b97f4a7c15ULL;
  return static_cast<double>(SplitMix64(state) >> 11) * 0x1.0p-53;
}

class Rng {
 public:
  // splitmix64 expands the 64-bit seed into the 256-bit state; four consecutive splitmix64 outputs
  // are never all zero (its output function is a bijection), so the state is always valid.
  explicit Rng(uint64_t seed = 0) {
    uint64_t sm = seed;
    for (uint64_t& w : s_) w = SplitMix64(sm);
  }

  uint64_t Next() {
    const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = Rotl(s_[3], 45);
    return result;
  }

  // Uniform in [0, 1) with 53 random bits: exactly representable, never 1.0.
  double NextDouble() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

 private:
  static uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

}  // namespace ds::sampling
