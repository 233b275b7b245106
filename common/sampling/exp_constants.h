// Constants of the sampler's exp (Cephes expf: exp(x) = 2^n * e^r with a degree-5 polynomial for
// e^r), shared by the CPU sampler (common/sampling/kernels.cc) and the CUDA one
// (kernels/cuda/sampling.cu): both must round alike to pick the same token for the same uniform.
// Plain constexpr scalars, usable from host and device code.
#pragma once

namespace ds::sampling::exp_constants {

constexpr float kExpLo = -87.33654f;  // ln(FLT_MIN): below, the result would be subnormal
constexpr float kExpHi = 88.0f;       // keeps 2^n finite (n <= 127)
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f;     // ln2 split so n * kLn2Hi is exact for |n| <= 128
constexpr float kLn2Lo = -2.12194440e-4f;  // ln2 - kLn2Hi
constexpr float kP0 = 1.9875691500e-4f;
constexpr float kP1 = 1.3981999507e-3f;
constexpr float kP2 = 8.3334519073e-3f;
constexpr float kP3 = 4.1665795894e-2f;
constexpr float kP4 = 1.6666665459e-1f;
constexpr float kP5 = 5.0000001201e-1f;

}  // namespace ds::sampling::exp_constants
