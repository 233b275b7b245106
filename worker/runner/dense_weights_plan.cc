#include "worker/runner/dense_weights_plan.h"

#include "absl/strings/str_format.h"

namespace ds {
namespace {

double Gib(uint64_t b) { return static_cast<double>(b) / (1ull << 30); }

}  // namespace

absl::StatusOr<DenseWeightsPlan> PlanDenseWeights(const MemoryPlanInput& in, uint64_t dense_bytes,
                                                  DenseWeights mode) {
  DenseWeightsPlan out;
  MemoryPlanInput with = in;
  with.weights += dense_bytes;
  if (mode == DenseWeights::kOn && dense_bytes > 0) {
    DS_ASSIGN_OR_RETURN(out.plan, PlanMemory(with));
    out.dense = true;
    out.reason = absl::StrFormat("on: %.2f GiB of 16-bit copies", Gib(dense_bytes));
    return out;
  }
  DS_ASSIGN_OR_RETURN(out.plan, PlanMemory(in));
  if (mode == DenseWeights::kOff || dense_bytes == 0) {
    out.reason = dense_bytes == 0 ? "no quantized layer matrices to copy" : "off";
    return out;
  }
  // auto: the copies must not cost the pool a page or the prefix cache a byte.
  auto dense = PlanMemory(with);
  if (!dense.ok()) {
    out.reason = absl::StrFormat("auto: off, %.2f GiB of copies do not fit beside the plan",
                                 Gib(dense_bytes));
    return out;
  }
  if (dense->pool_pages < out.plan.pool_pages || dense->cache < out.plan.cache ||
      dense->slots != out.plan.slots) {
    out.reason = absl::StrFormat(
        "auto: off, %.2f GiB of copies would shrink the KV pool from %d to %d tokens (or the "
        "prefix cache from %.2f to %.2f GiB); --dense-weights on trades that for speed",
        Gib(dense_bytes), out.plan.pool_tokens(), dense->pool_tokens(), Gib(out.plan.cache),
        Gib(dense->cache));
    return out;
  }
  out.dense = true;
  out.plan = *dense;
  out.reason = absl::StrFormat(
      "auto: on, %.2f GiB of copies beside an unchanged KV pool of %d tokens (every slot's full "
      "context)",
      Gib(dense_bytes), out.plan.pool_tokens());
  return out;
}

}  // namespace ds
