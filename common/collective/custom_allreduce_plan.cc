// Host-side decisions of the custom all-reduce (see custom_allreduce_plan.h).
#include "common/collective/custom_allreduce_plan.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"

namespace ds {

bool CarUseTwoShot(size_t bytes, int world, const CustomAllReduceOptions& o) {
  if (world <= 1) return false;
  switch (o.algo) {
    case CustomAllReduceOptions::Algo::kOneShot:
      return false;
    case CustomAllReduceOptions::Algo::kTwoShot:
      return true;
    case CustomAllReduceOptions::Algo::kAuto:
      break;
  }
  return bytes >= o.two_shot_min_bytes;
}

std::vector<std::pair<size_t, size_t>> CarChunks(size_t n, size_t capacity_floats) {
  std::vector<std::pair<size_t, size_t>> c;
  const size_t cap = std::max<size_t>(4, capacity_floats / 4 * 4);
  for (size_t off = 0; off < n; off += cap) c.emplace_back(off, std::min(cap, n - off));
  return c;
}

void CarReferenceSum(std::span<const float* const> in, size_t n, float* out) {
  for (size_t i = 0; i < n; ++i) {
    float acc = in[0][i];
    for (size_t q = 1; q < in.size(); ++q) acc += in[q][i];
    out[i] = acc;
  }
}

std::string CarHostIdentity() {
  char host[64] = {};
  gethostname(host, sizeof host - 1);
  std::string boot;
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::getline(f, boot);
  return absl::StrCat(host, "/", boot).substr(0, sizeof(CarRankInfo::host) - 1);
}

std::string CarCheckOneHost(std::span<const CarRankInfo> all, int rank) {
  for (size_t q = 0; q < all.size(); ++q)
    if (std::strncmp(all[q].host, all[rank].host, sizeof(CarRankInfo::host)) != 0)
      return absl::StrCat("rank ", q, " is on another host (", all[q].host, " vs ",
                          all[rank].host, "): the custom all-reduce needs every rank on one host");
  return "";
}

}  // namespace ds
