// The schedule the MTP executor tests drive (step_executor_mtp_test, step_executor_mtp_tp_test):
// three sequences as the scheduler would send them — slots 0 and 1 start together, slot 2 joins
// at step 3 with its prompt prefilled in the same Forward as the others' decodes (or verifies) —
// each generating kMaxNew tokens. The next step is built from the executor's own known tokens,
// which are the same on every rank of a TP group (rank 0 samples, the others follow), so every
// rank of a group is driven through the same steps.
#pragma once
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "common/util/model_alias.h"
#include "worker/backend_factory.h"
#include "worker/model/cpu_backend.h"
#include "worker/process/step_executor.h"

namespace ds::worker::mtp_test {

inline std::vector<int32_t> Prompt(int n, int salt) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back(static_cast<int32_t>((i * 37 + salt * 101) % 2000 + 5));
  return p;
}

struct Outcome {
  std::map<uint32_t, std::vector<int32_t>> generated;  // by slot, cut to kMaxNew
  int steps = 0;
  spec::SpecStats stats;
};

inline constexpr uint32_t kMaxNew = 40;

// follows: the decodes are sent as a scheduler sends them ahead with MTP (SlotWork::follows, no
// position: the executor continues each slot from its pending token).
inline Outcome DriveSteps(StepExecutor& ex, int n_vocab, float temperature, bool follows = false) {
  Outcome o;
  std::map<uint32_t, size_t> n_prompt;
  auto start = [&](Step& st, uint32_t slot, std::vector<int32_t> prompt) {
    for (int32_t& t : prompt) t %= n_vocab;  // (the tiny model's 512 ids)
    SequenceStart s;
    s.request_id = 100 + slot;
    s.slot = slot;
    s.tokens = prompt;
    s.sampling.temperature = temperature;
    s.sampling.seed = 7 + slot;
    s.max_new_tokens = kMaxNew;
    st.started.push_back(s);
    st.work.push_back(SlotWork{slot, 0, static_cast<uint32_t>(prompt.size()), true, false});
    n_prompt[slot] = prompt.size();
  };
  auto generated = [&](uint32_t slot) { return ex.known(static_cast<int>(slot)).size() - n_prompt[slot]; };
  uint64_t id = 1;
  for (int step = 0; step < 200; ++step) {
    Step st;
    st.step_id = id++;
    if (step == 0) {
      start(st, 0, Prompt(11, 0));
      start(st, 1, Prompt(23, 1));
    }
    for (uint32_t slot = 0; slot < 3 && step > 0; ++slot) {
      if (!n_prompt.count(slot) || generated(slot) >= kMaxNew) continue;
      const uint32_t known = static_cast<uint32_t>(ex.known(static_cast<int>(slot)).size());
      if (follows) {
        SlotWork w;
        w.slot = slot;
        w.decode_path = true;
        w.follows = true;  // pos0 / n_tokens / sample left for the executor
        st.work.push_back(w);
      } else {
        st.work.push_back(SlotWork{slot, known - 1, 1, true, true});
      }
    }
    if (step == 3) start(st, 2, Prompt(17, 2));
    if (st.work.empty()) break;
    const StepResult r = ex.Run(st);
    EXPECT_TRUE(r.error.empty()) << r.error;
    if (!r.error.empty()) break;
    ++o.steps;
  }
  for (const auto& [slot, np] : n_prompt) {
    const std::vector<int32_t>& k = ex.known(static_cast<int>(slot));
    std::vector<int32_t> g(k.begin() + static_cast<std::ptrdiff_t>(std::min(np, k.size())), k.end());
    EXPECT_GE(g.size(), kMaxNew) << "slot " << slot;
    if (g.size() > kMaxNew) g.resize(kMaxNew);  // a scheduler drops tokens past max_new
    o.generated[slot] = std::move(g);
  }
  o.stats = ex.mtp_stats();
  return o;
}

// The schedule on one CPU backend (`model`: "demo" or a file) with --mtp mtp_drafts (0: off).
// deferred: StepExecutor::SetDeferredDrafts (the drafts left on the backend for the next verify).
// device_sampling: the CPU twin of device sampling (CpuBackend::set_device_sampling), with which
// verifies queue their next chains in their own Forward (StepOptions::chain_after); *chains_after
// counts them.
inline Outcome DriveOneRank(int mtp_drafts, float temperature, const std::string& model = "demo",
                            bool automatic = false, bool follows = false, bool deferred = false,
                            bool device_sampling = false, int64_t* chains_after = nullptr) {
  BackendOptions bo;
  bo.n_slots = 3;
  bo.slot_ctx = 256;
  bo.n_threads = 2;
  auto be = CreateBackend("cpu", model == "demo" ? ResolveModelAlias("demo") : model, bo,
                          SpeculativeRoom{mtp_drafts + 1, 3});
  EXPECT_TRUE(be.ok()) << be.status();
  if (!be.ok()) return {};
  if (device_sampling) {
    auto* cpu = dynamic_cast<CpuBackend*>(be->get());
    EXPECT_NE(cpu, nullptr);
    if (cpu) cpu->set_device_sampling(true);
  }
  StepExecutor ex(be->get(), 3);
  EXPECT_TRUE(ex.SetMtp(spec::MtpSetting{mtp_drafts, automatic}).ok());
  ex.SetDeferredDrafts(deferred);
  Outcome o = DriveSteps(ex, (*be)->config().n_vocab, temperature, follows);
  if (chains_after) *chains_after = ex.chains_after_verify();
  return o;
}

}  // namespace ds::worker::mtp_test
