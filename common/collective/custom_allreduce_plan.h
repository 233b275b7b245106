// The host-side decisions of the IPC all-reduce (CustomAllReduceCollective, custom_allreduce.h),
// kept free of CUDA so CPU CI tests them: one-shot vs two-shot by message size, how a message
// larger than the IPC buffer is cut into chunks, whether a group may use it at all (every rank on
// one host, a GPU this process can reach), and the reference sum the kernels must reproduce bit
// for bit.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace ds {

struct CustomAllReduceOptions {
  // Per rank IPC staging buffer; larger messages run as several calls of at most this size.
  // 32 MiB holds a 27B prefill micro-step of 1,600 rows (5,120 floats each) in one call.
  size_t buffer_bytes = 32u << 20;
  // Messages of at least this many bytes use two-shot (reduce-scatter + all-gather: each rank
  // reads ~2·n floats instead of W·n); smaller ones one-shot (one barrier less: latency wins).
  size_t two_shot_min_bytes = 512u << 10;
  enum class Algo { kAuto, kOneShot, kTwoShot };
  Algo algo = Algo::kAuto;  // tests force one or the other
  // A block waiting longer than this for a peer gives up and the call fails (rank lost). As long
  // as Gloo's default (a peer that is still loading its shard must not trip it); JoinTpGroup
  // passes the group's timeout.
  double peer_timeout_seconds = 60;
};

// Whether a message of `bytes` runs two-shot in a group of `world` (the same on every rank).
bool CarUseTwoShot(size_t bytes, int world, const CustomAllReduceOptions& o);

// [offset, count) chunks of an n-float message for a buffer of `capacity_floats` (a multiple of
// 4, so every chunk but the last keeps 16-byte alignment). n = 0 → no chunk.
std::vector<std::pair<size_t, size_t>> CarChunks(size_t n, size_t capacity_floats);

// out[i] = in[0][i] + in[1][i] + ... + in[W-1][i], left to right in rank order: what every rank
// of the custom all-reduce must hold afterwards, bitwise. out may alias in[k].
void CarReferenceSum(std::span<const float* const> in, size_t n, float* out);

// What each rank publishes in the group's rendezvous before any IPC handle is exchanged.
struct CarRankInfo {
  char host[128] = {};     // hostname + kernel boot id: equal only for processes on one host
  char pci_bus[32] = {};   // cudaDeviceGetPCIBusId of the rank's GPU
  int32_t device = 0;      // the rank's device ordinal in its own process
  int32_t reserved = 0;
};

// This host's identity for CarRankInfo::host.
std::string CarHostIdentity();

// "" when every rank is on this rank's host, else why not (names the first other host).
std::string CarCheckOneHost(std::span<const CarRankInfo> all, int rank);

}  // namespace ds
