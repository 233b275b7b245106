#include "worker/runner/memory_planner.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ds {
namespace {

double Gib(uint64_t b) { return static_cast<double>(b) / (1ull << 30); }

// The device memory this worker may plan with (before the prefix cache's share).
uint64_t DeviceBudget(const MemoryPlanInput& in) {
  uint64_t b = in.device_free;
  if (in.device_total > 0 && in.memory_fraction < 1.0)
    b = std::min<uint64_t>(b, static_cast<uint64_t>(in.memory_fraction * in.device_total));
  return b > in.margin ? b - in.margin : 0;
}

uint64_t Fixed(const MemoryPlanInput& in, int slots, int64_t ctx) {
  return in.weights + in.workspace_fixed + in.workspace_per_ctx * static_cast<uint64_t>(ctx) +
         in.recurrent_per_slot * static_cast<uint64_t>(slots + 1) + in.recurrent_fixed;
}

// The prefix cache's share: all it asks when required, else at most a quarter of what the
// smallest plan (one slot) leaves.
uint64_t CacheShare(const MemoryPlanInput& in) {
  if (in.cache_bytes == 0 || in.cache_required) return in.cache_bytes;
  const uint64_t b = DeviceBudget(in), fixed = Fixed(in, 1, in.slot_ctx);
  return b > fixed ? std::min(in.cache_bytes, (b - fixed) / 4) : 0;
}

// What the weights, workspace, recurrent state and KV pool may take.
uint64_t Budget(const MemoryPlanInput& in) {
  const uint64_t b = DeviceBudget(in), cache = CacheShare(in);
  return b > cache ? b - cache : 0;
}

// Whole pages of KV that fit beside the fixed part (0 when nothing does).
int64_t PagesThatFit(const MemoryPlanInput& in, int slots, int64_t ctx) {
  const uint64_t budget = Budget(in), fixed = Fixed(in, slots, ctx);
  if (fixed >= budget) return 0;
  const uint64_t page_bytes = in.kv_per_token * static_cast<uint64_t>(in.page_size);
  return page_bytes ? static_cast<int64_t>((budget - fixed) / page_bytes) : INT64_MAX / 2;
}

int64_t PagesFor(const MemoryPlanInput& in, int64_t tokens) {
  return (tokens + in.page_size - 1) / in.page_size;
}

}  // namespace

std::string MemoryPlan::ToString() const {
  return absl::StrFormat(
      "budget %.2f GiB: weights %.2f + KV pool %.2f (%d tokens = %d pages of %d) + recurrent "
      "%.2f (%d+1 slots) + workspace %.2f + prefix cache %.2f = %.2f GiB; slot_ctx %d",
      Gib(budget), Gib(weights), Gib(kv), pool_tokens(), pool_pages, page_size, Gib(recurrent),
      slots, Gib(workspace), Gib(cache), Gib(total()), slot_ctx);
}

absl::StatusOr<MemoryPlan> PlanMemory(const MemoryPlanInput& in) {
  if (in.slot_ctx < 1 || in.page_size < 1 || in.slots < 0 || in.pool_tokens < 0 ||
      in.memory_fraction <= 0 || in.memory_fraction > 1)
    return absl::InvalidArgumentError(absl::StrCat(
        "memory plan: slot_ctx ", in.slot_ctx, ", page size ", in.page_size, ", slots ", in.slots,
        ", pool tokens ", in.pool_tokens, ", memory fraction ", in.memory_fraction,
        " (need slot_ctx, page size >= 1, fraction in (0, 1])"));
  const int64_t ctx_pages = PagesFor(in, in.slot_ctx);
  // A pool that cannot hold one full context is useless: that is the smallest plan.
  auto fits = [&](int slots, int64_t ctx, int64_t want_pages) {
    const int64_t have = PagesThatFit(in, slots, ctx);
    return have >= std::max(PagesFor(in, ctx), want_pages);
  };
  int slots = in.slots;
  if (slots == 0) {
    // The most slots whose pool still gives each min_tokens_per_slot (and one full context).
    for (int s = std::max(1, in.max_auto_slots); s >= 1; --s) {
      const int64_t want = std::max<int64_t>(
          in.pool_tokens > 0 ? PagesFor(in, in.pool_tokens) : 0,
          PagesFor(in, std::min<int64_t>(in.slot_ctx, in.min_tokens_per_slot) * s));
      if (fits(s, in.slot_ctx, want)) {
        slots = s;
        break;
      }
    }
    if (slots == 0) slots = 1;  // reported below as not fitting
  }
  const int64_t want_pages = in.pool_tokens > 0 ? PagesFor(in, in.pool_tokens) : 0;
  if (!fits(slots, in.slot_ctx, want_pages)) {
    // The nearest settings that fit: fewer slots at this context, a shorter context at these
    // slots, or the largest pool.
    std::string nearest;
    int s_fit = 0;
    for (int s = slots - 1; s >= 1 && !s_fit; --s)
      if (fits(s, in.slot_ctx, want_pages)) s_fit = s;
    if (s_fit) absl::StrAppend(&nearest, " --slots ", s_fit, " at this context;");
    // The most pages of context that fit `s` slots (0: none).
    auto max_ctx_pages = [&](int s) {
      int64_t lo = 0, hi = ctx_pages - 1;
      while (lo < hi) {
        const int64_t mid = (lo + hi + 1) / 2;
        if (fits(s, mid * in.page_size, want_pages)) lo = mid; else hi = mid - 1;
      }
      return lo;
    };
    if (const int64_t c = max_ctx_pages(slots); c >= 1)
      absl::StrAppend(&nearest, " --ctx ", c * in.page_size, " with ", slots, " slots;");
    else if (const int64_t c1 = slots > 1 && !s_fit ? max_ctx_pages(1) : 0; c1 >= 1)
      absl::StrAppend(&nearest, " --ctx ", c1 * in.page_size, " with 1 slot;");
    if (want_pages > 0) {
      const int64_t max_pages = PagesThatFit(in, slots, in.slot_ctx);
      if (max_pages >= ctx_pages)
        absl::StrAppend(&nearest, " a KV pool of ", max_pages * in.page_size, " tokens;");
    }
    if (nearest.empty()) nearest = " nothing: the weights and workspace alone do not fit;";
    nearest.pop_back();
    const uint64_t need = Fixed(in, slots, in.slot_ctx) +
                          in.kv_per_token * in.page_size * std::max(want_pages, ctx_pages);
    return absl::ResourceExhaustedError(absl::StrFormat(
        "memory plan: %d slots x %d tokens needs %.2f GiB (weights %.2f + workspace %.2f + "
        "recurrent %.2f + KV for %d tokens %.2f) but the budget is %.2f GiB (%.2f GiB free, "
        "memory fraction %.2f of %.2f GiB, %.2f GiB kept for the prefix cache); nearest that "
        "fits:%s; or a smaller --kv-type, or --max-step-tokens (the workspace is mostly [step "
        "tokens, width] buffers)%s",
        slots, in.slot_ctx, Gib(need), Gib(in.weights),
        Gib(in.workspace_fixed + in.workspace_per_ctx * in.slot_ctx),
        Gib(in.recurrent_per_slot * (slots + 1) + in.recurrent_fixed),
        std::max(want_pages, ctx_pages) * in.page_size,
        Gib(in.kv_per_token * in.page_size * std::max(want_pages, ctx_pages)), Gib(Budget(in)),
        Gib(in.device_free), in.memory_fraction, Gib(in.device_total), Gib(CacheShare(in)), nearest,
        in.cache_required ? ", or a smaller --prefix-cache-mb / --prefix-cache-tier auto" : ""));
  }
  MemoryPlan p;
  p.slots = slots;
  p.slot_ctx = in.slot_ctx;
  p.page_size = in.page_size;
  // Operator pool: as asked. Auto: everything that fits, but no more than every slot full.
  p.pool_pages = want_pages > 0 ? want_pages
                                : std::min<int64_t>(PagesThatFit(in, slots, in.slot_ctx),
                                                    ctx_pages * static_cast<int64_t>(slots + 1));
  p.budget = DeviceBudget(in);
  p.cache = CacheShare(in);
  p.weights = in.weights;
  p.kv = in.kv_per_token * in.page_size * static_cast<uint64_t>(p.pool_pages);
  p.recurrent = in.recurrent_per_slot * static_cast<uint64_t>(slots + 1) + in.recurrent_fixed;
  p.workspace = in.workspace_fixed + in.workspace_per_ctx * static_cast<uint64_t>(in.slot_ctx);
  return p;
}

}  // namespace ds
