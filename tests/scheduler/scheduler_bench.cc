// Control overhead of one scheduler step (Schedule + Apply, fabricated results) at batch 1 and 64.
// The goal: far under 150 us per step, so the scheduler never shows next to a ~7 ms decode forward.
//  BM_DecodeStep:  every slot decoding; a request that ends is replaced at once (its 32-token
//                  prompt is prefilled in the next step), so admission and release are included.
//  BM_MixedStep:   as above with 2000-token prompts chunked by 512 under a 2048 budget.
#include <cstdint>
#include <vector>

#include "absl/time/time.h"
#include "benchmark/benchmark.h"
#include "scheduler/core/scheduler.h"

namespace ds::sched {
namespace {

void RunSteps(benchmark::State& state, int prompt_len, int max_new) {
  const int batch = static_cast<int>(state.range(0));
  SchedulerConfig cfg;
  cfg.n_slots = batch;
  cfg.max_num_batched_tokens = 2048;
  cfg.max_chunk = 512;
  cfg.max_queue = 4 * batch;
  cfg.context = {ContextPolicy::Kind::kPool, int64_t{batch} * 4096, 4096};
  auto s = std::move(Scheduler::Create(cfg)).value();
  RequestId next = 1;
  auto add = [&] {
    Request r;
    r.id = next++;
    r.prompt.assign(prompt_len, 42);
    r.max_new_tokens = max_new;
    r.stop_ids = {2};
    r.arrival = absl::UnixEpoch();
    if (!s->Add(std::move(r)).ok()) std::abort();
  };
  for (int i = 0; i < batch; ++i) add();
  absl::Time now = absl::UnixEpoch();
  StepResults res;
  int64_t tokens = 0;
  for (auto _ : state) {
    now += absl::Milliseconds(7);
    absl::StatusOr<StepPlan> plan = s->Schedule(now);
    res.step_id = plan->step_id;
    res.tokens.assign(plan->n_sampled, 10);
    absl::StatusOr<std::vector<Event>> ev = s->Apply(*plan, res, now);
    for (const Event& e : *ev) {
      if (e.kind == Event::Kind::kFinished) add();
    }
    tokens += plan->n_tokens;
    benchmark::DoNotOptimize(ev);
  }
  state.counters["tokens/step"] =
      benchmark::Counter(static_cast<double>(tokens) / static_cast<double>(state.iterations()));
}

void BM_DecodeStep(benchmark::State& state) { RunSteps(state, 32, 256); }
void BM_MixedStep(benchmark::State& state) { RunSteps(state, 2000, 64); }

BENCHMARK(BM_DecodeStep)->Arg(1)->Arg(64);
BENCHMARK(BM_MixedStep)->Arg(1)->Arg(64);

}  // namespace
}  // namespace ds::sched

BENCHMARK_MAIN();
