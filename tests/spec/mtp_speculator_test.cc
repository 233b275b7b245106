// MTP speculative decoding over the CPU backend (worker/spec/mtp_speculator.h, issue #15):
// greedy with drafts gives exactly the tokens of greedy without; the state after a rejection is
// the state of a run that never saw the rejected drafts; sampled tokens follow the distribution
// of plain sampling (two-sample chi-square on the first two generated positions).
#include "worker/spec/mtp_speculator.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>

#include "common/sampling/sampling_params.h"
#include "common/util/model_alias.h"
#include "tests/model/test_util.h"
#include "worker/model/cpu_backend.h"

namespace ds::spec {
namespace {

std::unique_ptr<CpuBackend> Make(const std::string& path, int n_slots, int ctx) {
  BackendOptions o;
  o.n_slots = n_slots;
  o.slot_ctx = ctx;
  o.n_threads = 2;
  auto b = CpuBackend::Create(path, o);
  EXPECT_TRUE(b.ok()) << b.status();
  return b.ok() ? std::move(*b) : nullptr;
}

std::vector<int32_t> Tokens(int n, int n_vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(rng() % n_vocab);
  return t;
}

sampling::SamplingParams Params(float temperature, int top_k, uint64_t seed) {
  sampling::SamplingParams p;
  p.temperature = temperature;
  p.top_k = top_k;
  p.seed = seed;
  return p;
}

// Plain decoding, one token per Forward: the reference.
std::vector<int32_t> PlainDecode(Backend& be, int slot, const std::vector<int32_t>& prompt,
                                 int n_new, sampling::Sampler& sampler) {
  std::vector<int32_t> toks = prompt;
  be.ResetSlot(slot);
  SeqStep s;
  s.slot = slot;
  s.pos0 = 0;
  s.tokens = prompt;
  StepOutput out;
  EXPECT_TRUE(be.Forward({&s, 1}, {}, &out).ok());
  for (int i = 0; i < n_new; ++i) {
    toks.push_back(sampler.Sample(out.logits, toks).token);
    if (i + 1 == n_new) break;
    s.pos0 = static_cast<int32_t>(toks.size()) - 1;
    s.tokens = {toks.back()};
    EXPECT_TRUE(be.Forward({&s, 1}, {}, &out).ok());
  }
  return toks;
}

// Runs sequences with MTP until each has n_new generated tokens (the speculator stops drafting
// at max_new); returns each one's tokens.
std::vector<std::vector<int32_t>> SpecDecode(Backend& be, int k,
                                             const std::vector<std::vector<int32_t>>& prompts,
                                             int n_new, std::vector<sampling::Sampler>& samplers,
                                             SpecStats* stats = nullptr, bool draft_chain = true,
                                             bool automatic = false, bool deferred = false,
                                             int64_t* chains_after_verify = nullptr) {
  MtpSpeculatorOptions o;
  o.k = k;
  o.draft_chain = draft_chain;
  o.automatic = automatic;
  o.deferred_drafts = deferred;
  auto sp = MtpSpeculator::Create(&be, o);
  EXPECT_TRUE(sp.ok()) << sp.status();
  std::vector<SpecSequence> seqs(prompts.size());
  std::vector<SpecSequence*> ptrs;
  for (size_t i = 0; i < prompts.size(); ++i) {
    be.ResetSlot(static_cast<int>(i));
    seqs[i].slot = static_cast<int>(i);
    seqs[i].tokens = prompts[i];
    seqs[i].sampler = &samplers[i];
    seqs[i].max_new = n_new;
    ptrs.push_back(&seqs[i]);
  }
  absl::Status st = sp->Start(ptrs);
  EXPECT_TRUE(st.ok()) << st;
  while (st.ok()) {
    std::vector<SpecSequence*> live;
    for (SpecSequence* s : ptrs)
      if (s->n_generated() < n_new) live.push_back(s);
    if (live.empty()) break;
    st = sp->Step(live);
    EXPECT_TRUE(st.ok()) << st;
  }
  if (stats) *stats = sp->stats();
  if (chains_after_verify) *chains_after_verify = sp->chains_after_verify();
  std::vector<std::vector<int32_t>> out;
  for (const SpecSequence& s : seqs) out.push_back(s.tokens);
  return out;
}

void ExpectGreedyEqual(const std::string& model, int k, int n_new, bool expect_accepts) {
  const int kSeqs = 3;
  auto be = Make(model, kSeqs, 512);
  ASSERT_TRUE(be);
  const int V = be->config().n_vocab;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < kSeqs; ++i) prompts.push_back(Tokens(5 + 7 * i, V, 40 + i));
  std::vector<std::vector<int32_t>> want;
  for (int i = 0; i < kSeqs; ++i) {
    sampling::Sampler greedy(Params(0, 0, 1));
    want.push_back(PlainDecode(*be, i, prompts[i], n_new, greedy));
  }
  std::vector<sampling::Sampler> samplers;
  for (int i = 0; i < kSeqs; ++i) samplers.emplace_back(Params(0, 0, 1));
  SpecStats stats;
  const auto got = SpecDecode(*be, k, prompts, n_new, samplers, &stats);
  for (int i = 0; i < kSeqs; ++i) {
    ASSERT_EQ(got[i].size(), want[i].size()) << "sequence " << i;
    EXPECT_EQ(got[i], want[i]) << "sequence " << i << " k " << k;
  }
  EXPECT_GT(stats.steps, 0);
  if (expect_accepts) {
    EXPECT_GT(stats.accepted[0], 0);
    // Fewer steps than tokens: the drafts paid.
    EXPECT_GT(stats.mean_accepted_length(), 1.2) << "k " << k;
  }
}

TEST(MtpSpeculator, GreedyEqualsPlainGreedyOnTheTinyModel) {
  for (int k : {1, 3}) ExpectGreedyEqual(testing::TinyModelPath(), k, 256, false);
}

TEST(MtpSpeculator, GreedyEqualsPlainGreedyOnTheDemoModelAndAccepts) {
  ExpectGreedyEqual(ResolveModelAlias("demo"), 3, 48, true);
}

// The most drafts a request or `--mtp` may ask for (sampling::kMaxMtpDrafts): the CUDA draft
// chain held fewer until 2026-12-07 and `generate --mtp 10` failed there; here the speculator's
// whole path at that count.
TEST(MtpSpeculator, GreedyEqualsPlainGreedyAtTheMostDrafts) {
  ExpectGreedyEqual(ResolveModelAlias("demo"), sampling::kMaxMtpDrafts, 48, true);
}

// `--mtp auto` (generate's path): the drafts per step follow each sequence's acceptance and, for a
// lone sequence, the cost the speculator times from its own steps, down to steps without drafts
// (at least the plain steps it asks for to keep that cost measured); the tokens stay plain
// greedy's, alone and three at a time.
TEST(MtpSpeculator, AutoKeepsGreedyTokensWhateverItDrafts) {
  auto be = Make(ResolveModelAlias("demo"), 3, 1024);
  ASSERT_TRUE(be);
  const int V = be->config().n_vocab;
  for (int n_seqs : {1, 3}) {
    // Alone: past the first plain steps asked for even at ~4 tokens a step.
    const int n_new = n_seqs == 1 ? 4 * DraftCostEstimator::kPlainEvery + 64 : 64;
    std::vector<std::vector<int32_t>> prompts, want;
    std::vector<sampling::Sampler> samplers;
    for (int i = 0; i < n_seqs; ++i) {
      prompts.push_back(Tokens(6 + 5 * i, V, 70 + i));
      sampling::Sampler greedy(Params(0, 0, 1));
      want.push_back(PlainDecode(*be, i, prompts[i], n_new, greedy));
      samplers.emplace_back(Params(0, 0, 1));
    }
    SpecStats stats;
    const auto got = SpecDecode(*be, 3, prompts, n_new, samplers, &stats, /*draft_chain=*/true,
                                /*automatic=*/true);
    for (int i = 0; i < n_seqs; ++i) EXPECT_EQ(got[i], want[i]) << n_seqs << " sequences, " << i;
    ASSERT_FALSE(stats.offered.empty());
    EXPECT_GT(stats.offered[0], 0) << "a new sequence drafts the cap until it has been seen";
    if (n_seqs == 1) {
      EXPECT_GT(stats.steps, stats.offered[0]) << "no step without drafts";
    }
  }
}

// Sampling with MTP gives, per seed, exactly the tokens of plain sampling (speculative_rule.h: each
// verify row draws with the uniform of its position), with and without penalties (the host path
// and the draft-chain path), at k 1 and 3; the demo model keeps drafts, so both outcomes occur.
TEST(MtpSpeculator, SampledStreamsEqualPlainSamplingPerSeed) {
  auto be = Make(ResolveModelAlias("demo"), 2, 512);
  ASSERT_TRUE(be);
  const int V = be->config().n_vocab;
  const std::vector<std::vector<int32_t>> prompts = {Tokens(9, V, 61), Tokens(14, V, 62)};
  const int kNew = 40;
  sampling::SamplingParams with_penalty = Params(0.9f, 0, 0);
  with_penalty.repetition_penalty = 1.15f;
  with_penalty.presence_penalty = 0.1f;
  int64_t kept = 0, rejected = 0;
  for (const sampling::SamplingParams& base :
       {Params(0.8f, 40, 0), Params(1.0f, 0, 0), with_penalty}) {
    for (uint64_t seed : {3ULL, 4ULL}) {
      std::vector<std::vector<int32_t>> want;
      std::vector<sampling::Sampler> samplers;
      for (size_t i = 0; i < prompts.size(); ++i) {
        sampling::SamplingParams p = base;
        p.seed = seed * 10 + i;
        sampling::Sampler plain(p);
        want.push_back(PlainDecode(*be, static_cast<int>(i), prompts[i], kNew, plain));
        samplers.emplace_back(p);
      }
      for (int k : {1, 3}) {
        std::vector<sampling::Sampler> fresh = samplers;
        SpecStats stats;
        const auto got = SpecDecode(*be, k, prompts, kNew, fresh, &stats);
        for (size_t i = 0; i < prompts.size(); ++i)
          EXPECT_EQ(got[i], want[i]) << "sequence " << i << " k " << k << " seed " << seed
                                     << " temperature " << base.temperature;
        for (size_t j = 0; j < stats.offered.size(); ++j) {
          kept += stats.accepted[j];
          rejected += stats.offered[j] - stats.accepted[j];
        }
      }
    }
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(rejected, 0);
}

TEST(MtpSpeculator, DraftChainGivesTheHostPathsDraftsAndTokens) {
  // Plain greedy takes the draft chain (Backend::MtpDraftGreedy: on the CPU the device's default,
  // hidden rows read back, argmax on the host); the host path (MtpRows / MtpStep with the
  // sampler) must give the same drafts — the same acceptance at every position — and tokens.
  auto be = Make(ResolveModelAlias("demo"), 2, 256);
  ASSERT_TRUE(be);
  ASSERT_TRUE(be->SupportsDraftChain());
  const int V = be->config().n_vocab;
  const std::vector<std::vector<int32_t>> prompts = {Tokens(9, V, 7), Tokens(20, V, 8)};
  SpecStats chain, host;
  std::vector<sampling::Sampler> s1, s2;
  for (int i = 0; i < 2; ++i) {
    s1.emplace_back(Params(0, 0, 1));
    s2.emplace_back(Params(0, 0, 1));
  }
  const auto a = SpecDecode(*be, 3, prompts, 24, s1, &chain, true);
  const auto b = SpecDecode(*be, 3, prompts, 24, s2, &host, false);
  EXPECT_EQ(a, b);
  EXPECT_EQ(chain.steps, host.steps);
  EXPECT_EQ(chain.offered, host.offered);
  EXPECT_EQ(chain.accepted, host.accepted);
  EXPECT_GT(chain.accepted[0], 0);
}

// Deferred drafts (MtpSpeculatorOptions::deferred_drafts): the draft chain leaves its drafts with
// the backend and the next verify takes them there (on the CPU the runner puts them into the
// verify's rows itself; on a GPU the device copies them, mtp_gpu_test). Whatever the route, the
// tokens and the drafts (the acceptance at every position) are those of drafts waited for:
// greedy, sampled, with penalties (the host path, which never defers), fixed k and `auto`.
TEST(MtpSpeculator, DeferredDraftsGiveTheSameTokensAndDrafts) {
  auto be = Make(ResolveModelAlias("demo"), 2, 512);
  ASSERT_TRUE(be);
  const int V = be->config().n_vocab;
  const std::vector<std::vector<int32_t>> prompts = {Tokens(9, V, 17), Tokens(15, V, 18)};
  sampling::SamplingParams with_penalty = Params(0.9f, 0, 5);
  with_penalty.repetition_penalty = 1.15f;
  int64_t kept = 0;
  for (const sampling::SamplingParams& p :
       {Params(0, 0, 1), Params(0.8f, 40, 3), with_penalty}) {
    for (const bool automatic : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "temperature " << p.temperature << " penalty "
                                        << p.repetition_penalty << " auto " << automatic);
      SpecStats waited, deferred;
      std::vector<sampling::Sampler> s1(2, sampling::Sampler(p)), s2(2, sampling::Sampler(p));
      const auto a = SpecDecode(*be, 3, prompts, 40, s1, &waited, true, automatic, false);
      const auto b = SpecDecode(*be, 3, prompts, 40, s2, &deferred, true, automatic, true);
      EXPECT_EQ(a, b);
      EXPECT_EQ(waited.steps, deferred.steps);
      EXPECT_EQ(waited.offered, deferred.offered);
      EXPECT_EQ(waited.accepted, deferred.accepted);
      for (int64_t x : deferred.accepted) kept += x;
    }
  }
  EXPECT_GT(kept, 0);
}

// Chains after the verify (StepOptions::chain_after): with the verify's rows sampled where the
// logits are (here the CPU twin of device sampling, CpuDevice::Sample) and a fixed k, the
// verify's Forward queues each sequence's next draft chain itself (on a GPU the device judges the
// drafts behind the sampling, mtp_gpu_test; on the CPU the runner judges them after the step).
// The tokens and the acceptance at every position are those of chains queued by the speculator
// after the verify, greedy and sampled; near max_new, where the draft count depends on the
// verdict, the speculator queues them itself.
TEST(MtpSpeculator, ChainsAfterTheVerifyGiveTheSameTokensAndDrafts) {
  const std::string path = ResolveModelAlias("demo");
  auto plain = Make(path, 2, 512), twin = Make(path, 2, 512);
  ASSERT_TRUE(plain && twin);
  twin->set_device_sampling(true);
  ASSERT_TRUE(twin->SupportsChainAfterVerify());
  ASSERT_FALSE(plain->SupportsChainAfterVerify());
  const int V = plain->config().n_vocab;
  const std::vector<std::vector<int32_t>> prompts = {Tokens(9, V, 27), Tokens(15, V, 28)};
  int64_t kept = 0;
  for (const sampling::SamplingParams& p : {Params(0, 0, 1), Params(0.8f, 40, 3)}) {
    SCOPED_TRACE(::testing::Message() << "temperature " << p.temperature);
    SpecStats host, after;
    int64_t chains_host = -1, chains_after = -1;
    std::vector<sampling::Sampler> s1(2, sampling::Sampler(p)), s2(2, sampling::Sampler(p));
    const auto a = SpecDecode(*plain, 3, prompts, 37, s1, &host, true, false, true, &chains_host);
    const auto b = SpecDecode(*twin, 3, prompts, 37, s2, &after, true, false, true, &chains_after);
    EXPECT_EQ(a, b);
    EXPECT_EQ(host.steps, after.steps);
    EXPECT_EQ(host.offered, after.offered);
    EXPECT_EQ(host.accepted, after.accepted);
    EXPECT_EQ(chains_host, 0);
    // Every verify but those near max_new (a few per sequence) queued its chain itself.
    EXPECT_GE(chains_after, after.steps * 2 / 3) << "of " << after.steps << " verify steps";
    for (int64_t x : after.accepted) kept += x;
  }
  EXPECT_GT(kept, 0);
}

// StepOptions::chain_after is refused before anything runs where it cannot be honoured: without
// device sampling, for a sequence out of range, twice for one sequence, without drafts to make,
// or over rows that are not sampled on the device.
TEST(MtpSpeculator, ChainAfterVerifyRefusesWhatItCannotDo) {
  const std::string path = ResolveModelAlias("demo");
  auto be = Make(path, 1, 128);
  ASSERT_TRUE(be);
  const int V = be->config().n_vocab;
  const std::vector<int32_t> prompt = Tokens(10, V, 31);
  SeqStep s;
  s.slot = 0;
  s.tokens = prompt;
  StepOutput out;
  ASSERT_TRUE(be->Forward({&s, 1}, {}, &out).ok());
  const sampling::SamplingParams greedy = Params(0, 0, 1);
  SeqStep v;
  v.slot = 0;
  v.pos0 = static_cast<int32_t>(prompt.size());
  v.tokens = {5, 6, 7};
  v.all_logits = true;
  v.speculative = true;
  v.decode_path = true;
  std::vector<DeviceSampleRow> rows(3);
  for (DeviceSampleRow& r : rows) {
    r.mode = DeviceSampleRow::Mode::kSample;
    r.params = &greedy;
    r.history = prompt;
  }
  auto forward = [&](std::vector<ChainAfterVerify> chains) {
    StepOptions o;
    o.device_sample = rows;
    o.chain_after = chains;
    return be->Forward({&v, 1}, o, &out).code();
  };
  // No device sampling on this backend.
  EXPECT_EQ(forward({{0, 2}}), absl::StatusCode::kInvalidArgument);
  be->set_device_sampling(true);
  EXPECT_EQ(forward({{1, 2}}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(forward({{0, 2}, {0, 2}}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(forward({{0, 0}}), absl::StatusCode::kInvalidArgument);
  rows[1].mode = DeviceSampleRow::Mode::kLogits;
  EXPECT_EQ(forward({{0, 2}}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(be->SlotLength(0), static_cast<int32_t>(prompt.size()));
  rows[1].mode = DeviceSampleRow::Mode::kSample;
  ASSERT_EQ(forward({{0, 2}}), absl::StatusCode::kOk);
  ASSERT_TRUE(be->CommitSpeculative(0, 1).ok());
}

// The runner's side of deferred drafts (StepRunner::MtpDraftDeferred, SeqStep::chain_drafts): the
// slot's next Forward takes them (StepOutput::chain_drafts: the drafts MtpDraftGreedy gives from
// the same state), a count that does not match or nothing deferred is refused before anything
// runs, and a Forward of the slot without chain_drafts, or ResetSlot, drops them.
TEST(MtpSpeculator, DeferredDraftsAreTakenByTheSlotsNextStepOnly) {
  const std::string path = ResolveModelAlias("demo");
  auto a = Make(path, 2, 128), b = Make(path, 2, 128);
  ASSERT_TRUE(a && b);
  const int V = a->config().n_vocab;
  const std::vector<int32_t> prompt = Tokens(12, V, 23);
  const int32_t next = 42;  // the token after the prompt
  StepOutput out;
  auto prefill = [&](Backend& be) {
    be.ResetSlot(0);
    SeqStep s;
    s.slot = 0;
    s.tokens = prompt;
    s.all_logits = true;
    return be.Forward({&s, 1}, {}, &out);
  };
  const int32_t p_last = static_cast<int32_t>(prompt.size()) - 1;
  const std::vector<int32_t> catch_up = {next};
  ASSERT_TRUE(prefill(*a).ok());
  ASSERT_TRUE(a->MtpDraftDeferred(0, p_last, catch_up, p_last, 3).ok());
  ASSERT_TRUE(prefill(*b).ok());
  std::vector<int32_t> want;
  ASSERT_TRUE(b->MtpDraftGreedy(0, p_last, catch_up, p_last, 3, &want).ok());
  ASSERT_EQ(want.size(), 3u);

  SeqStep v;
  v.slot = 0;
  v.pos0 = static_cast<int32_t>(prompt.size());
  v.all_logits = true;
  v.speculative = true;
  v.decode_path = true;
  v.chain_drafts = true;
  v.tokens = {next, -1, -1};  // two drafts: the chain made three
  EXPECT_EQ(a->Forward({&v, 1}, {}, &out).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a->SlotLength(0), static_cast<int32_t>(prompt.size()));
  v.tokens = {next, -1, -1, -1};
  ASSERT_TRUE(a->Forward({&v, 1}, {}, &out).ok());
  EXPECT_EQ(out.chain_drafts, want);
  // The same step with the drafts spelled out gives the same logits.
  StepOutput out_b;
  SeqStep w = v;
  w.chain_drafts = false;
  w.tokens = {next, want[0], want[1], want[2]};
  ASSERT_TRUE(b->Forward({&w, 1}, {}, &out_b).ok());
  EXPECT_EQ(out.logits, out_b.logits);
  EXPECT_TRUE(out_b.chain_drafts.empty());
  ASSERT_TRUE(a->CommitSpeculative(0, 1).ok());
  // Taken: a second step cannot take them again.
  v.pos0 = a->SlotLength(0);
  EXPECT_EQ(a->Forward({&v, 1}, {}, &out).code(), absl::StatusCode::kInvalidArgument);

  // Dropped by a Forward of the slot without chain_drafts.
  SeqStep one;
  one.slot = 0;
  one.pos0 = a->SlotLength(0);
  one.tokens = {7};
  ASSERT_TRUE(a->Forward({&one, 1}, {}, &out).ok());
  const int32_t p1 = a->SlotLength(0) - 1;
  ASSERT_TRUE(a->MtpDraftDeferred(0, p1, std::vector<int32_t>{9}, 0, 2).ok());
  one.pos0 = a->SlotLength(0);
  one.tokens = {9};
  ASSERT_TRUE(a->Forward({&one, 1}, {}, &out).ok());
  v.pos0 = a->SlotLength(0);
  v.tokens = {9, -1, -1};
  EXPECT_EQ(a->Forward({&v, 1}, {}, &out).code(), absl::StatusCode::kInvalidArgument);

  // Dropped by ResetSlot.
  ASSERT_TRUE(prefill(*a).ok());
  ASSERT_TRUE(a->MtpDraftDeferred(0, p_last, catch_up, p_last, 2).ok());
  a->ResetSlot(0);
  ASSERT_TRUE(prefill(*a).ok());
  v.pos0 = static_cast<int32_t>(prompt.size());
  v.tokens = {next, -1, -1};
  EXPECT_EQ(a->Forward({&v, 1}, {}, &out).code(), absl::StatusCode::kInvalidArgument);
}

TEST(MtpSpeculator, DraftChainNeedsTheLastMicroStepsRows) {
  auto be = Make(ResolveModelAlias("demo"), 1, 64);
  ASSERT_TRUE(be);
  std::vector<int32_t> drafts;
  // No Forward yet: nothing to draft from.
  EXPECT_EQ(be->MtpDraftGreedy(0, 0, std::vector<int32_t>{1}, 0, 2, &drafts).code(),
            absl::StatusCode::kFailedPrecondition);
  SeqStep s;
  s.slot = 0;
  s.pos0 = 0;
  s.tokens = {5, 6, 7, 8};
  s.all_logits = true;
  StepOutput out;
  ASSERT_TRUE(be->Forward({&s, 1}, {}, &out).ok());
  // Rows 3..4 of a 4-row output: out of range.
  EXPECT_EQ(be->MtpDraftGreedy(0, 3, std::vector<int32_t>{9, 9}, 3, 2, &drafts).code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(be->MtpDraftGreedy(0, 0, std::vector<int32_t>{6, 7, 8, 9}, 0, 2, &drafts).ok());
  ASSERT_EQ(drafts.size(), 2u);
  for (int32_t d : drafts) EXPECT_TRUE(d >= 0 && d < be->config().n_vocab);
}

TEST(MtpSpeculator, RollbackEqualsARunThatNeverSawTheRejectedDrafts) {
  const std::string& path = testing::TinyModelPath();
  auto a = Make(path, 1, 128), b = Make(path, 1, 128);
  ASSERT_TRUE(a && b);
  const int V = a->config().n_vocab;
  const auto prompt = Tokens(9, V, 5);
  const auto extra = Tokens(5, V, 6);  // pending token + 4 drafts
  for (int keep = 1; keep <= 5; ++keep) {
    for (Backend* be : {static_cast<Backend*>(a.get()), static_cast<Backend*>(b.get())}) {
      be->ResetSlot(0);
      SeqStep s;
      s.slot = 0;
      s.tokens = prompt;
      StepOutput out;
      ASSERT_TRUE(be->Forward({&s, 1}, {}, &out).ok());
    }
    SeqStep v;
    v.slot = 0;
    v.pos0 = 9;
    v.tokens = extra;
    v.all_logits = true;
    v.speculative = true;
    StepOutput out;
    ASSERT_TRUE(a->Forward({&v, 1}, {}, &out).ok());
    // Nothing else may touch the backend before the commit.
    EXPECT_EQ(a->Forward({&v, 1}, {}, &out).code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(a->Snapshot(0).status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(a->CommitSpeculative(0, 6).code(), absl::StatusCode::kInvalidArgument);
    ASSERT_TRUE(a->CommitSpeculative(0, keep).ok());
    EXPECT_EQ(a->CommitSpeculative(0, keep).code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(a->SlotLength(0), 9 + keep);
    // The reference only ever sees the kept tokens, one decode step each.
    for (int t = 0; t < keep; ++t) {
      SeqStep d;
      d.slot = 0;
      d.pos0 = 9 + t;
      d.tokens = {extra[t]};
      ASSERT_TRUE(b->Forward({&d, 1}, {}, &out).ok());
    }
    auto sa = a->Snapshot(0), sb = b->Snapshot(0);
    ASSERT_TRUE(sa.ok() && sb.ok());
    EXPECT_EQ(sa->bytes, sb->bytes) << "keep " << keep;
    // And the next step agrees bit for bit.
    SeqStep n;
    n.slot = 0;
    n.pos0 = 9 + keep;
    n.tokens = {3};
    StepOutput oa, ob;
    ASSERT_TRUE(a->Forward({&n, 1}, {}, &oa).ok());
    ASSERT_TRUE(b->Forward({&n, 1}, {}, &ob).ok());
    EXPECT_EQ(oa.logits, ob.logits) << "keep " << keep;
  }
}

// SeqStep::fill_mtp writes the MTP layer's K/V over a prompt inside the Forward. The slot's whole
// state (the CPU snapshot carries the MTP rows, their mask and length) equals what MtpRows over
// the prompt's hidden rows leaves: whole or in two Forwards (mtp_next pairs the first one's last
// row with the second one's first token), in one micro-step or cut into several.
TEST(MtpSpeculator, FillMtpWritesWhatMtpRowsWould) {
  const std::string& path = testing::TinyModelPath();
  auto a = Make(path, 1, 128), b = Make(path, 1, 128);
  ASSERT_TRUE(a && b);
  const int V = a->config().n_vocab, H = a->config().n_embd;
  const auto prompt = Tokens(40, V, 11);
  for (const int cut : {40, 17}) {
    for (const int max_rows : {1 << 20, 7}) {
      a->set_micro_step_limits(max_rows, max_rows);
      b->set_micro_step_limits(max_rows, max_rows);
      a->ResetSlot(0);
      b->ResetSlot(0);
      std::vector<float> hidden;  // the reference: every row's state, then one MtpRows
      for (const auto& [c0, c1] : {std::pair{0, cut}, std::pair{cut, 40}}) {
        if (c0 == c1) continue;
        SeqStep s;
        s.slot = 0;
        s.pos0 = c0;
        s.tokens.assign(prompt.begin() + c0, prompt.begin() + c1);
        s.all_logits = true;
        StepOptions want;
        want.want_hidden = true;
        StepOutput out;
        ASSERT_TRUE(a->Forward({&s, 1}, want, &out).ok());
        hidden.insert(hidden.end(), out.hidden.begin(), out.hidden.end());
        s.all_logits = false;
        s.fill_mtp = true;
        s.mtp_next = c1 < 40 ? prompt[c1] : -1;
        ASSERT_TRUE(b->Forward({&s, 1}, {}, &out).ok());
      }
      std::vector<float> logits, h;
      ASSERT_TRUE(a->MtpRows(0, 0, std::span<const int32_t>(prompt).subspan(1),
                             std::span<const float>(hidden).first(39 * static_cast<size_t>(H)),
                             &logits, &h)
                      .ok());
      auto sa = a->Snapshot(0), sb = b->Snapshot(0);
      ASSERT_TRUE(sa.ok() && sb.ok());
      EXPECT_EQ(sa->bytes, sb->bytes) << "cut " << cut << " max_rows " << max_rows;
    }
  }
  // What it refuses: with a verify, and a next token outside the vocabulary.
  b->ResetSlot(0);
  SeqStep s;
  s.slot = 0;
  s.tokens = {1, 2};
  s.fill_mtp = true;
  s.mtp_next = V;
  StepOutput out;
  EXPECT_EQ(b->Forward({&s, 1}, {}, &out).code(), absl::StatusCode::kInvalidArgument);
  s.mtp_next = -1;
  s.speculative = true;
  EXPECT_EQ(b->Forward({&s, 1}, {}, &out).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(b->SlotLength(0), 0);
}

TEST(MtpSpeculator, RefusesWhatItCannotDo) {
  auto be = Make(testing::TinyModelPath(), 1, 64);
  ASSERT_TRUE(be);
  auto with_k = [](int k) {
    MtpSpeculatorOptions o;
    o.k = k;
    return o;
  };
  EXPECT_EQ(MtpSpeculator::Create(be.get(), with_k(0)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MtpSpeculator::Create(be.get(), with_k(be->max_speculative_tokens())).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MtpSpeculator::Create(be.get(), with_k(be->max_speculative_tokens() - 1)).ok());
  EXPECT_EQ(be->CommitSpeculative(0, 1).code(), absl::StatusCode::kFailedPrecondition);
  SeqStep s;
  s.slot = 0;
  s.tokens.assign(be->max_speculative_tokens() + 1, 1);
  s.speculative = true;
  StepOutput out;
  EXPECT_EQ(be->Forward({&s, 1}, {}, &out).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(be->SlotLength(0), 0);
}

// Two-sample chi-square statistic of two count tables; categories with fewer than 10 draws in
// both together are pooled. Returns {statistic, degrees of freedom}.
std::pair<double, int> Homogeneity(const std::map<int32_t, int64_t>& a,
                                   const std::map<int32_t, int64_t>& b) {
  std::map<int32_t, std::pair<double, double>> cells;
  for (const auto& [id, c] : a) cells[id].first += c;
  for (const auto& [id, c] : b) cells[id].second += c;
  std::vector<std::pair<double, double>> kept;
  std::pair<double, double> pooled{0, 0};
  for (const auto& [id, c] : cells) {
    if (c.first + c.second < 10) {
      pooled.first += c.first;
      pooled.second += c.second;
    } else {
      kept.push_back(c);
    }
  }
  if (pooled.first + pooled.second > 0) kept.push_back(pooled);
  double na = 0, nb = 0;
  for (const auto& c : kept) {
    na += c.first;
    nb += c.second;
  }
  double chi = 0;
  for (const auto& c : kept) {
    const double tot = c.first + c.second;
    const double ea = tot * na / (na + nb), eb = tot * nb / (na + nb);
    chi += (c.first - ea) * (c.first - ea) / ea + (c.second - eb) * (c.second - eb) / eb;
  }
  return {chi, static_cast<int>(kept.size()) - 1};
}

// Upper 0.1% point of chi-square with df degrees of freedom (Wilson-Hilferty).
double Chi2Critical(int df) {
  const double z = 3.09, h = 2.0 / (9.0 * df);
  return df * std::pow(1.0 - h + z * std::sqrt(h), 3);
}

TEST(MtpSpeculator, SampledTokensFollowThePlainDistribution) {
  auto be = Make(testing::TinyModelPath(), 1, 64);
  ASSERT_TRUE(be);
  const int V = be->config().n_vocab;
  const auto prompt = Tokens(6, V, 77);
  const int kRuns = 2500;
  std::map<int32_t, int64_t> plain1, plain2, spec1, spec2;
  SpecStats total;
  total.offered.assign(2, 0);
  total.accepted.assign(2, 0);
  for (int r = 0; r < kRuns; ++r) {
    // The whole vocabulary at temperature 1: the random tiny model's MTP head and main model
    // overlap enough that drafts are both kept and resampled.
    sampling::Sampler plain(Params(1.0f, 0, 1000 + r));
    const auto p = PlainDecode(*be, 0, prompt, 2, plain);
    ++plain1[p[6]];
    ++plain2[p[7]];
    std::vector<sampling::Sampler> samplers;
    samplers.emplace_back(Params(1.0f, 0, 5000000 + r));
    SpecStats stats;
    const auto s = SpecDecode(*be, 2, {prompt}, 3, samplers, &stats);
    ++spec1[s[0][6]];
    ++spec2[s[0][7]];
    for (int j = 0; j < 2; ++j) {
      total.offered[j] += stats.offered[j];
      total.accepted[j] += stats.accepted[j];
    }
  }
  // The rule ran both ways: some drafts kept, some resampled.
  EXPECT_GT(total.accepted[0], 0);
  EXPECT_LT(total.accepted[0], total.offered[0]);
  for (const auto& [a, b] : {std::pair{&plain1, &spec1}, std::pair{&plain2, &spec2}}) {
    const auto [chi, df] = Homogeneity(*a, *b);
    ASSERT_GE(df, 2);
    EXPECT_LT(chi, Chi2Critical(df)) << "df " << df;
  }
}

}  // namespace
}  // namespace ds::spec
