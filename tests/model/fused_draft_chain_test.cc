// The fused draft chain on the CUDA device (issue #15; kernels/cuda/mtp_chain.cuh; label `gpu`,
// built into mtp_gpu_test, not run in CI; on a device: tools/device/fused_draft_check.sh).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <vector>

#include "common/gguf/gguf.h"
#include "common/util/model_alias.h"
#include "tests/gpu_test_options.h"
#include "tests/model/mtp_gpu_fixtures.h"
#include "worker/cuda/cuda_backend.h"
#include "worker/cuda/cuda_options.h"
#include "worker/model/backend.h"

namespace ds {
namespace {

using namespace mtp_test;  // the shared fixtures of the MTP GPU tests (mtp_gpu_fixtures.h)

// The trained demo model, or a synthetic file of `m`'s weight type.
std::shared_ptr<const gguf::File> OpenChainModel(bool demo, const Model& m) {
  if (!demo) return Synth(m);
  auto f = gguf::File::Open(ResolveModelAlias("demo"));
  EXPECT_TRUE(f.ok()) << f.status();
  return f.ok() ? std::shared_ptr<const gguf::File>(std::move(*f)) : nullptr;
}

// A CUDA backend with room for one verify of up to 6 tokens, the chain fused (in its resident
// form or not; the global form with its S2 stage folded into the attention's or not, with its
// weight prefetch or not) or not.
std::unique_ptr<Backend> ChainBackend(std::shared_ptr<const gguf::File> file, bool fused,
                                      bool resident = true, bool fold_prep = false,
                                      bool prefetch = false) {
  CudaBackendOptions co;
  co.spec_tokens = 6;
  co.spec_seqs = 1;
  co.fused_draft_chain = fused;
  co.draft_chain_resident = resident;
  co.draft_chain_fold_prep = fold_prep;
  co.draft_chain_prefetch = prefetch;
  auto b = CreateCudaBackend(std::move(file), Opts(), co);
  EXPECT_TRUE(b.ok()) << b.status();
  return b.ok() ? std::move(*b) : nullptr;
}

// Round r of the chain tests: a verify of 1 + r % 5 rows from the sequence's pending token (the
// last of `toks`), then 1 + r % 4 drafts from its catch-up rows (each row paired with the token
// after it, the last with a new one).
struct DraftRound {
  int n_drafts = 0;
  int32_t pos0 = 0;
  std::vector<int32_t> rows, catchup;
  DraftRound(int round, const std::vector<int32_t>& toks, int V)
      : n_drafts(1 + round % 4), pos0(static_cast<int32_t>(toks.size()) - 1),
        rows(toks.end() - 1, toks.end()) {
    for (int i = 1; i < 1 + round % 5; ++i) rows.push_back((round * 31 + i * 7) % V);
    catchup.assign(rows.begin() + 1, rows.end());
    catchup.push_back((round * 13 + 1) % V);
  }
  int n_rows() const { return static_cast<int>(rows.size()); }
  // The round's verify rows through `be` (slot 0, every row's logits; the decode kernels unless
  // the hidden states are wanted: the CPU reference's host path), into *out.
  absl::Status Verify(Backend& be, bool want_hidden, StepOutput* out) const {
    SeqStep s;
    s.slot = 0;
    s.pos0 = pos0;
    s.tokens = rows;
    s.all_logits = true;
    s.decode_path = !want_hidden;
    StepOptions o;
    o.want_hidden = want_hidden;
    return be.Forward({&s, 1}, o, out);
  }
  // Verify, then the draft chain on the device.
  absl::Status VerifyThenChain(Backend& be, std::vector<int32_t>* drafts) const {
    StepOutput out;
    DS_RETURN_IF_ERROR(Verify(be, false, &out));
    return be.MtpDraftGreedy(0, pos0, catchup, 0, n_drafts, drafts);
  }
};

// The fused draft chain (kernels/cuda/mtp_chain.cuh: every pass in one thread-block-cluster
// kernel, on by default where the MTP block takes it) against the per-kernel chain of a second
// backend over the same file (CudaBackendOptions::fused_draft_chain off) and against the CPU
// reference (the host path: CPU Forward, MtpRows, MtpStep, argmax on the host): the same drafts,
// round after round (each round's chain writes the MTP K/V rows and mask the next rounds attend
// to), for 1..5 catch-up rows and 1..4 drafts, on F32, F16 and BF16 matrices and the trained demo
// model. Against the per-kernel chain every draft must match; against the CPU (other kernels,
// other rounding) a draft is compared where the CPU's top two logits are at least 1e-3 of the
// largest |logit| apart, and a round stops at its first near-tie (both sides then continue from
// different drafts). The fused kernel runs in both its forms (resident and global, the default;
// the global one also with its q / k prep folded into the attention stage, fold_prep, with its
// weight prefetch, prefetch_weights, and with both), which must
// give the same drafts bit for bit; the test also checks that each ran (FusedDraftChains,
// FusedDraftChainResident).
TEST(FusedDraftChain, SameDraftsAsThePerKernelChain) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  struct Case {
    const char* name;
    GgmlType type;
    bool demo;
  };
  const Case cases[] = {{"F32", GgmlType::F32, false},
                        {"F16", GgmlType::F16, false},
                        {"BF16", GgmlType::BF16, false},
                        {"demo", GgmlType::F16, true}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    std::shared_ptr<const gguf::File> file = OpenChainModel(c.demo, Model{c.name, c.type, 0});
    ASSERT_TRUE(file);
    // fused (resident), per kernel, CPU, fused (global), fused (global, S2 folded into S3),
    // fused (global, prefetch), fused (global, folded, prefetch)
    constexpr int kBackends = 7;
    std::unique_ptr<Backend> be[kBackends];
    for (int i = 0; i < 2; ++i) {
      be[i] = ChainBackend(file, /*fused=*/i == 0);
      ASSERT_TRUE(be[i]);
    }
    be[3] = ChainBackend(file, /*fused=*/true, /*resident=*/false);
    ASSERT_TRUE(be[3]);
    be[4] = ChainBackend(file, /*fused=*/true, /*resident=*/false, /*fold_prep=*/true);
    ASSERT_TRUE(be[4]);
    be[5] = ChainBackend(file, true, /*resident=*/false, /*fold_prep=*/false, /*prefetch=*/true);
    ASSERT_TRUE(be[5]);
    be[6] = ChainBackend(file, true, /*resident=*/false, /*fold_prep=*/true, /*prefetch=*/true);
    ASSERT_TRUE(be[6]);
    {
      auto b = CreateCpuBackend(file, Opts());
      ASSERT_TRUE(b.ok()) << b.status();
      be[2] = std::move(*b);
    }
    const int V = be[0]->config().n_vocab;
    std::vector<int32_t> toks = Prompt(kPrompt, V);
    for (auto& b : be) {
      const absl::Status st = PrefillWithMtpRows(*b, 0, toks);
      ASSERT_TRUE(st.ok()) << st;
    }
    toks.push_back(3);
    int64_t compared = 0, cpu_compared = 0;
    for (int round = 0; round < 12; ++round) {
      SCOPED_TRACE(::testing::Message() << "round " << round);
      const DraftRound d(round, toks, V);
      const int n_rows = d.n_rows(), n_drafts = d.n_drafts;
      const int32_t pos0 = d.pos0;
      const std::vector<int32_t>& catchup = d.catchup;
      std::vector<int32_t> drafts[kBackends];
      for (int i = 0; i < kBackends; ++i) {
        if (i != 2) {
          const absl::Status st = d.VerifyThenChain(*be[i], &drafts[i]);
          ASSERT_TRUE(st.ok()) << st;
          continue;
        }
        StepOutput out;
        absl::Status st = d.Verify(*be[2], /*want_hidden=*/true, &out);
        ASSERT_TRUE(st.ok()) << st;
        // The CPU reference, draft by draft, while no near-tie has made the paths part.
        std::vector<float> l, h, ch;
        st = be[2]->MtpRows(0, pos0, catchup, out.hidden, &l, &h);
        ASSERT_TRUE(st.ok()) << st;
        for (int j = 0; j < n_drafts; ++j) {
          if (j > 0) {
            ch = h;
            st = be[2]->MtpStep(0, drafts[0][j - 1], pos0 + n_rows - 1 + j, ch, &l, &h);
            ASSERT_TRUE(st.ok()) << st;
          }
          std::vector<float> top(l);
          std::partial_sort(top.begin(), top.begin() + 2, top.end(), std::greater<float>());
          float scale = 0;
          for (float x : l) scale = std::max(scale, std::abs(x));
          if (top[0] - top[1] < 1e-3f * scale) break;  // a near-tie: the rest is not comparable
          EXPECT_EQ(drafts[0][j], Argmax(l.data(), V)) << "draft " << j;
          ++cpu_compared;
        }
      }
      EXPECT_EQ(drafts[0], drafts[1]);
      EXPECT_EQ(drafts[0], drafts[3]);
      EXPECT_EQ(drafts[0], drafts[4]);
      EXPECT_EQ(drafts[0], drafts[5]);
      EXPECT_EQ(drafts[0], drafts[6]);
      compared += static_cast<int64_t>(drafts[0].size());
      toks.insert(toks.end(), catchup.begin(), catchup.end());
    }
    EXPECT_EQ(compared, 30);
    EXPECT_GE(cpu_compared, 20);  // near-ties are rare: most drafts are checked against the CPU
    std::printf("%s: %lld of 30 drafts compared with the CPU\n", c.name,
                static_cast<long long>(cpu_compared));
    auto* fused = dynamic_cast<cuda::CudaBackend*>(be[0].get());
    auto* plain = dynamic_cast<cuda::CudaBackend*>(be[1].get());
    auto* global = dynamic_cast<cuda::CudaBackend*>(be[3].get());
    auto* folded = dynamic_cast<cuda::CudaBackend*>(be[4].get());
    ASSERT_TRUE(fused && plain && global && folded);
    // The portable path (the sm_70 kernels forced on this GPU) has no clusters: no fused chain.
    const bool clusters = !ds::testing::ForcePortable();
    EXPECT_EQ(fused->FusedDraftChains(), clusters ? 12 : 0);
    EXPECT_EQ(fused->FusedDraftChainResident(), clusters);
    EXPECT_EQ(global->FusedDraftChains(), clusters ? 12 : 0);
    EXPECT_FALSE(global->FusedDraftChainResident());
    EXPECT_EQ(folded->FusedDraftChains(), clusters ? 12 : 0);
    for (int i : {5, 6}) {
      auto* prefetching = dynamic_cast<cuda::CudaBackend*>(be[i].get());
      ASSERT_TRUE(prefetching);
      EXPECT_EQ(prefetching->FusedDraftChains(), clusters ? 12 : 0);
    }
    EXPECT_EQ(plain->FusedDraftChains(), 0);
  }
}

}  // namespace
}  // namespace ds
