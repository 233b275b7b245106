// `deltaserve logits`, `generate` and `info`: single-process use of a backend.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/collective/collective.h"
#include "common/gguf/gguf.h"
#include "common/sampling/sampler.h"
#include "common/sampling/sampling_params.h"
#include "common/tokenizer/chat_format.h"
#include "common/tokenizer/incremental_decoder.h"
#include "common/tokenizer/tokenizer.h"
#include "common/util/model_alias.h"
#include "tools/cli/args.h"
#include "tools/cli/commands.h"
#include "tools/cli/device_tuning_args.h"
#include "worker/backend_factory.h"
#include "worker/model/kv_type.h"
#include "worker/spec/mtp_setting.h"
#include "worker/spec/mtp_speculator.h"
#ifdef DS_HAVE_NCCL
#include "common/collective/nccl_collective.h"
#endif

namespace ds::cli {
namespace {

using sampling::Sampler;
using sampling::SampleResult;
using sampling::SamplingParams;

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "deltaserve: error: %s\n", std::string(s.message()).c_str());
  return 1;
}

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Prefill in chunks so a long prompt never needs one huge activation buffer.
constexpr int kPrefillChunk = 512;

absl::Status Prefill(Backend& be, const std::vector<int32_t>& prompt, bool all_logits,
                     std::vector<float>* logits) {
  logits->clear();
  for (size_t p = 0; p < prompt.size(); p += kPrefillChunk) {
    SeqStep step;
    step.slot = 0;
    step.pos0 = static_cast<int32_t>(p);
    const size_t n = std::min<size_t>(kPrefillChunk, prompt.size() - p);
    step.tokens.assign(prompt.begin() + p, prompt.begin() + p + n);
    step.all_logits = all_logits;
    StepOutput out;
    DS_RETURN_IF_ERROR(be.Forward({&step, 1}, StepOptions{}, &out));
    if (all_logits || p + n == prompt.size())
      logits->insert(logits->end(), out.logits.begin(), out.logits.end());
  }
  return absl::OkStatus();
}

}  // namespace

int CmdLogits(int argc, char** argv) {
  // --tp-nccl: run the forward through a one-rank NCCL communicator (ncclGetUniqueId +
  // ncclCommInitRank over 1 rank), i.e. the TP code path at world 1; the logits must be
  // bit-identical to a run without it.
  auto args =
      Args::Parse(argc, argv, {"--model", "--prompt-ids", "--out", "--backend"}, {"--tp-nccl"});
  if (!args.ok()) return Fail(args.status());
  auto model = args->Required("--model");
  if (model.ok()) *model = ResolveModelAlias(*model);
  auto ids_s = args->Required("--prompt-ids");
  auto out_path = args->Required("--out");
  if (!model.ok()) return Fail(model.status());
  if (!ids_s.ok()) return Fail(ids_s.status());
  if (!out_path.ok()) return Fail(out_path.status());
  auto ids = ParseIdList(*ids_s);
  if (!ids.ok()) return Fail(ids.status());
  BackendOptions bo;
  bo.n_slots = 1;
  bo.slot_ctx = static_cast<int>(ids->size());
  // Declared before the backend, which points into it, so it is destroyed after it.
  std::unique_ptr<Collective> coll;
  if (args->Has("--tp-nccl")) {
#ifdef DS_HAVE_NCCL
    if (args->Str("--backend", "cpu") == "cpu")
      return Fail(absl::InvalidArgumentError("--tp-nccl needs --backend cuda"));
    auto id = NcclCollective::NewUniqueId();
    if (!id.ok()) return Fail(id.status());
    auto c = NcclCollective::Create(/*rank=*/0, /*world=*/1, *id, bo.device);
    if (!c.ok()) return Fail(c.status());
    coll = std::move(*c);
    bo.collective = coll.get();
    std::fprintf(stderr, "tp: one-rank %s communicator\n", coll->name().c_str());
#else
    return Fail(absl::UnimplementedError("--tp-nccl: this build has no NCCL (DS_HAVE_NCCL)"));
#endif
  }
  auto be = CreateBackend(args->Str("--backend", "cpu"), *model, bo);
  if (!be.ok()) return Fail(be.status());
  std::vector<float> logits;
  if (auto s = Prefill(**be, *ids, /*all_logits=*/true, &logits); !s.ok()) return Fail(s);
  std::ofstream f(*out_path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(logits.data()),
          static_cast<std::streamsize>(logits.size() * sizeof(float)));
  if (!f) return Fail(absl::InternalError("cannot write " + *out_path));
  std::fprintf(stderr, "wrote %zu x %d logits to %s\n", ids->size(), (*be)->config().n_vocab,
               out_path->c_str());
  return 0;
}

int CmdGenerate(int argc, char** argv) {
  std::set<std::string> valued = {"--model",          "--prompt",  "--prompt-ids", "--max-tokens",
                                  "--temperature",    "--top-k",   "--top-p",      "--min-p",
                                  "--repeat-penalty", "--seed",    "--ctx",        "--backend",
                                  "--threads",        "--kv-type", "--mtp",        "--fused-draft",
                                  "--mtp-full-tail"};
  // The worker's device switches (worker/process/device_tuning.h: --dense-weights, --early-launch,
  // --tiled-f16-formats, --gdn-state, ...), but --portable, a bare switch here as before.
  std::vector<std::string> tuning_names;
  for (const std::string& f : DeviceTuningFlagNames())
    if (f != "--portable") tuning_names.push_back(f);
  valued.insert(tuning_names.begin(), tuning_names.end());
  auto args = Args::Parse(argc, argv, valued, {"--json", "--ignore-eos", "--chat", "--portable"});
  if (!args.ok()) return Fail(args.status());
  DeviceTuning tuning;
  if (auto s = DeviceTuningFromArgs(*args, tuning_names, &tuning); !s.ok()) return Fail(s);
  tuning.portable = args->Has("--portable");  // CUDA: the sm_70 (V100) kernels on any GPU
  auto model = args->Required("--model");
  if (!model.ok()) return Fail(model.status());
  *model = ResolveModelAlias(*model);
  auto mtp_setting = spec::ParseMtpSetting(args->Str("--mtp", "off"));
  if (!mtp_setting.ok()) return Fail(mtp_setting.status());
  const int mtp_k = spec::DraftsForBatch(*mtp_setting, 1);  // one stream
  const int* mtp = &mtp_k;
  if (args->Has("--prompt") == args->Has("--prompt-ids"))
    return Fail(absl::InvalidArgumentError("give exactly one of --prompt or --prompt-ids"));
  auto max_tokens = args->Int("--max-tokens", 64);
  auto ctx = args->Int("--ctx", 4096);
  auto threads = args->Int("--threads", 0);
  if (!max_tokens.ok()) return Fail(max_tokens.status());
  if (!ctx.ok()) return Fail(ctx.status());
  if (!threads.ok()) return Fail(threads.status());
  if (*max_tokens < 1) return Fail(absl::InvalidArgumentError("--max-tokens must be >= 1"));

  SamplingParams sp;
  {
    auto t = args->Float("--temperature", 0.0);
    auto k = args->Int("--top-k", 0);
    auto p = args->Float("--top-p", 1.0);
    auto mp = args->Float("--min-p", 0.0);
    auto rp = args->Float("--repeat-penalty", 1.0);
    auto seed = args->UInt("--seed", 0);
    for (const absl::Status& s : {t.status(), k.status(), p.status(), mp.status(), rp.status(),
                                  seed.status()})
      if (!s.ok()) return Fail(s);
    sp.temperature = static_cast<float>(*t);
    sp.top_k = static_cast<int>(*k);
    sp.top_p = static_cast<float>(*p);
    sp.min_p = static_cast<float>(*mp);
    sp.repetition_penalty = static_cast<float>(*rp);
    sp.seed = *seed;
  }

  // Tokenizer from the same file (the backend maps it separately; mmap is shared by the OS).
  auto file = gguf::File::Open(*model);
  if (!file.ok()) return Fail(file.status());
  auto tok = Tokenizer::FromGguf(**file);
  if (!tok.ok()) return Fail(tok.status());

  std::vector<int32_t> prompt;
  if (args->Has("--prompt-ids")) {
    auto ids = ParseIdList(args->Str("--prompt-ids"));
    if (!ids.ok()) return Fail(ids.status());
    prompt = *ids;
  } else {
    if (!tok->has_vocab())
      return Fail(absl::InvalidArgumentError(
          "model has no vocabulary (tokenizer.ggml.model = none); use --prompt-ids"));
    std::string text = args->Str("--prompt");
    if (args->Has("--chat")) {
      auto chat = FormatChatML({{"user", text}}, /*add_generation_prompt=*/true);
      if (!chat.ok()) return Fail(chat.status());
      text = *chat;
    }
    auto enc = tok->Encode(text, /*parse_special=*/args->Has("--chat"));
    if (!enc.ok()) return Fail(enc.status());
    prompt = *enc;
  }
  if (prompt.empty()) return Fail(absl::InvalidArgumentError("empty prompt"));
  if (static_cast<int64_t>(prompt.size()) + *max_tokens > *ctx)
    return Fail(absl::OutOfRangeError(
        "prompt (" + std::to_string(prompt.size()) + " tokens) + --max-tokens (" +
        std::to_string(*max_tokens) + ") exceeds the context (" + std::to_string(*ctx) +
        "); raise --ctx"));

  BackendOptions bo;
  bo.n_slots = 1;
  bo.slot_ctx = static_cast<int>(*ctx);
  bo.n_threads = static_cast<int>(*threads);
  auto kv_type = ParseKvType(args->Str("--kv-type", "f16"));
  if (!kv_type.ok()) return Fail(kv_type.status());
  bo.kv_type = *kv_type;  // q8_0 / q4_0: CUDA only (the CPU backend refuses them)
  ApplyDeviceTuning(tuning, &bo);  // CUDA switches; the CPU backend emulates --gdn-state bf16 and --prefill-fp8
  // CUDA: the draft chain in one kernel where the MTP block takes it (off: one kernel per op).
  // --mtp: the last verifies keep all k drafts past --max-tokens (the surplus tokens are not
  // printed): a verify of fewer drafts is a shape the device has not captured as a graph and
  // runs eagerly (~69 launches on the demo model), while surplus rows in the captured shape
  // cost nothing. Off: the drafts shrink to what --max-tokens leaves (A/B).
  auto full_tail = args->OnOff("--mtp-full-tail", true);
  if (!full_tail.ok()) return Fail(full_tail.status());
  auto fused_draft = args->OnOff("--fused-draft", true);
  if (!fused_draft.ok()) return Fail(fused_draft.status());
  bo.fused_draft_chain = *fused_draft;
  // With --mtp the device keeps room for one sequence's verify step of k + 1 tokens.
  const SpeculativeRoom room{mtp_k > 0 ? mtp_k + 1 : 0, mtp_k > 0 ? 1 : 0};
  auto be_or = CreateBackend(args->Str("--backend", "auto"), *model, bo, room);
  if (!be_or.ok()) return Fail(be_or.status());
  Backend& be = **be_or;
  const int n_vocab = be.config().n_vocab;
  if (auto s = sampling::Validate(sp, n_vocab); !s.ok()) return Fail(s);
  for (int32_t id : prompt)
    if (id < 0 || id >= n_vocab)
      return Fail(absl::InvalidArgumentError("token id " + std::to_string(id) +
                                             " is outside the vocabulary (0.." +
                                             std::to_string(n_vocab - 1) + ")"));

  const bool json = args->Has("--json");
  const bool ignore_eos = args->Has("--ignore-eos");
  Sampler sampler(sp);
  std::vector<int32_t> history = prompt;
  std::vector<int32_t> generated;
  std::string text;
  IncrementalDecoder detok(&*tok);

  const double t0 = Now();
  std::vector<float> logits;
  // With --mtp the speculator prefills (every row's hidden state feeds the MTP layer) and hands
  // out 1..k+1 tokens per verify step; otherwise one Forward per token.
  std::optional<spec::MtpSpeculator> speculator;
  spec::SpecSequence seq;
  std::vector<int32_t> ready;  // speculated tokens not yet printed, in order
  if (*mtp > 0) {
    spec::MtpSpeculatorOptions so;
    so.k = *mtp;
    so.automatic = mtp_setting->automatic;
    // --deferred-drafts: the next verify reads the drafts where they were made (one host wait
    // per cycle instead of two; the same tokens).
    so.deferred_drafts = tuning.deferred_drafts;
    auto sp = spec::MtpSpeculator::Create(&be, so);
    if (!sp.ok()) return Fail(sp.status());
    speculator.emplace(std::move(*sp));
    seq.tokens = prompt;
    seq.sampler = &sampler;
    seq.max_new = static_cast<int>(*max_tokens) + (*full_tail ? so.k : 0);
    spec::SpecSequence* one = &seq;
    if (auto s = speculator->Start({&one, 1}); !s.ok()) return Fail(s);
    ready.assign(seq.tokens.begin() + prompt.size(), seq.tokens.end());
  } else if (auto s = Prefill(be, prompt, false, &logits); !s.ok()) {
    return Fail(s);
  }
  const double t1 = Now();
  std::string finish = "length";
  for (int64_t i = 0; i < *max_tokens; ++i) {
    SampleResult r;
    if (speculator) {
      if (ready.empty()) {
        const size_t before = seq.tokens.size();
        spec::SpecSequence* one = &seq;
        if (auto s = speculator->Step({&one, 1}); !s.ok()) return Fail(s);
        ready.assign(seq.tokens.begin() + before, seq.tokens.end());
      }
      r.token = ready.front();
      ready.erase(ready.begin());
    } else {
      r = sampler.Sample(logits, history);
    }
    generated.push_back(r.token);
    history.push_back(r.token);
    if (!ignore_eos && tok->IsEos(r.token)) {
      finish = "stop";
      break;
    }
    if (tok->has_vocab()) {
      auto delta_or = detok.Feed(r.token);
      if (!delta_or.ok()) return Fail(delta_or.status());
      const std::string& delta = *delta_or;
      text += delta;
      if (!json) {
        std::fwrite(delta.data(), 1, delta.size(), stdout);
        std::fflush(stdout);
      }
    } else if (!json) {
      std::printf("%d ", r.token);
      std::fflush(stdout);
    }
    if (i + 1 == *max_tokens || speculator) continue;
    SeqStep step;
    step.slot = 0;
    step.pos0 = static_cast<int32_t>(history.size() - 1);
    step.tokens = {r.token};
    StepOutput out;
    if (auto s = be.Forward({&step, 1}, StepOptions{}, &out); !s.ok()) return Fail(s);
    logits = std::move(out.logits);
  }
  if (tok->has_vocab()) {
    const std::string tail = detok.Flush();
    text += tail;
    if (!json) std::fwrite(tail.data(), 1, tail.size(), stdout);
  }
  const double t2 = Now();
  const double prompt_tps = prompt.size() / std::max(1e-9, t1 - t0);
  // The first generated token comes from the prefill logits; decode steps = generated - 1.
  const double gen_tps = generated.size() > 1 ? (generated.size() - 1) / std::max(1e-9, t2 - t1) : 0;
  if (json) {
    nlohmann::json j;
    j["tokens"] = generated;
    j["text"] = text;
    j["finish_reason"] = finish;
    j["prompt_tokens"] = prompt.size();
    j["generated_tokens"] = generated.size();
    j["prompt_tokens_per_second"] = prompt_tps;
    j["generation_tokens_per_second"] = gen_tps;
    j["backend"] = be.name();
    if (speculator) {
      const spec::SpecStats& st = speculator->stats();
      j["mtp"]["drafts"] = *mtp;
      j["mtp"]["verify_steps"] = st.steps;
      j["mtp"]["mean_accepted_length"] = st.mean_accepted_length();
      for (int d = 0; d < *mtp; ++d)
        j["mtp"]["acceptance"].push_back(
            st.offered[d] ? static_cast<double>(st.accepted[d]) / st.offered[d] : 0.0);
    }
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else {
    std::printf("\n");
    std::fprintf(stderr, "[%s] prompt %zu tok %.1f tok/s | generated %zu tok %.1f tok/s | %s\n",
                 be.name().c_str(), prompt.size(), prompt_tps, generated.size(), gen_tps,
                 finish.c_str());
    if (speculator)
      std::fprintf(stderr, "[mtp k=%d] %lld verify steps, %.2f tokens per step\n", *mtp,
                   static_cast<long long>(speculator->stats().steps),
                   speculator->stats().mean_accepted_length());
  }
  return 0;
}

int CmdInfo(int argc, char** argv) {
  auto args = Args::Parse(argc, argv, {"--model"}, {});
  if (!args.ok()) return Fail(args.status());
  auto model = args->Required("--model");
  if (!model.ok()) return Fail(model.status());
  *model = ResolveModelAlias(*model);
  auto file = gguf::File::Open(*model);
  if (!file.ok()) return Fail(file.status());
  auto cfg = ModelConfig::FromGguf(**file);
  if (!cfg.ok()) return Fail(cfg.status());
  uint64_t bytes = 0;
  for (const auto& t : (*file)->tensors()) bytes += t.nbytes;
  std::printf("arch %s: %d layers (%d DeltaNet + %d attention) + %d MTP, hidden %d, ffn %d, vocab %d\n",
              cfg->arch.c_str(), cfg->n_layer, cfg->n_recurrent(), cfg->n_attention(), cfg->n_nextn,
              cfg->n_embd, cfg->n_ff, cfg->n_vocab);
  std::printf("attention: %d heads / %d kv heads x %d (rope %d dims, base %g)\n", cfg->n_head,
              cfg->n_head_kv, cfg->head_dim, cfg->n_rot, cfg->rope_base);
  std::printf("deltanet: %d k heads / %d v heads, dk %d dv %d, conv %d\n", cfg->gdn_k_heads,
              cfg->gdn_v_heads, cfg->gdn_k_dim, cfg->gdn_v_dim, cfg->conv_kernel);
  std::printf("tensors: %zu, %.3f GiB\n", (*file)->tensors().size(), bytes / 1073741824.0);
  return 0;
}

}  // namespace ds::cli
