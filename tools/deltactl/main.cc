// deltactl: command-line client of a deltaserve cluster (public Generation API and Admin API).
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>

#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/auth/tls.h"
#include "common/config/role.h"
#include "deltaserve/v1/deltaserve.grpc.pb.h"
#include "gateway/client.h"
#include "tools/deltactl/flags.h"
#include "tools/loadgen/loadgen.h"

namespace {

namespace v1 = deltaserve::v1;
using ds::ctl::Flags;

constexpr const char* kDefaultAddr = "127.0.0.1:50051";
constexpr const char* kDefaultAdminAddr = "127.0.0.1:50052";

void Usage(FILE* out) {
  std::fprintf(
      out,
      "usage: deltactl <command> [flags]   (deltactl <command> --help: this text, exit 0)\n"
      "commands:\n"
      "  generate    --addr A (--prompt TEXT | --prompt-ids 1,2,3 | --chat-user TEXT "
      "[--chat-system "
      "TEXT])\n"
      "              [--max-tokens N --temperature T --top-k K --top-p P --min-p P --seed S\n"
      "               --stop S (repeatable) --stop-id N (repeatable) --logprobs N --priority N\n"
      "               --ignore-eos --timeout SECONDS --api-key K --request-id ID\n"
      "               --show-ids | --ids-only]\n"
      "  tokenize    --addr A (--prompt TEXT | --chat-user TEXT)\n"
      "  health      --addr A: grpc.health.v1 status\n"
      "  status      --admin-addr A: workers, slots, queue and context pool\n"
      "  set-slots   N --admin-addr A   (N >= 1, at most the worker's configured slots)\n"
      "  set-context --split static|pool --total N [--slot-cap N] --admin-addr A\n"
      "  drain       [--resume] --admin-addr A\n"
      "  load        --addr A --concurrency C --requests N --prompt-len L --max-tokens M [--seed S "
      "--vocab V --no-ignore-eos --timeout SECONDS --reject-backoff-ms MS --shared-prefix N "
      "--prompt-len-max L2]\n"
      "              (--shared-prefix: every prompt starts with the same N ids; --prompt-len-max: "
      "own ids uniform in [L, L2])\n"
      "TLS to the public listener (generate, tokenize, health): --tls (system roots) or\n"
      "  --ca-file F [--server-name NAME] [--cert F --key F]   (the admin listener is plaintext)\n"
      "Numbers are checked against what the request field holds: no silent wrap-around.\n");
}

// Flags of the public-listener commands that select TLS.
const std::set<std::string> kTlsFlags = {"--ca-file", "--server-name", "--cert", "--key"};

// The public listener's channel: plaintext, or TLS when --tls / --ca-file are given.
absl::StatusOr<std::shared_ptr<grpc::Channel>> PublicChannel(const Flags& f) {
  const std::string addr = f.Str("--addr", kDefaultAddr);
  ds::auth::ClientTlsFiles tls;
  tls.tls = f.Has("--tls") || f.Has("--ca-file");
  if (!tls.tls) {
    for (const std::string& flag : kTlsFlags)
      if (f.Has(flag)) return absl::InvalidArgumentError(flag + " needs --tls or --ca-file");
    return ds::gw::MakeChannel(addr);
  }
  tls.ca_file = f.Str("--ca-file");
  tls.server_name = f.Str("--server-name");
  tls.cert_file = f.Str("--cert");
  tls.key_file = f.Str("--key");
  return ds::auth::MakeChannel(addr, tls);
}

std::set<std::string> With(std::set<std::string> a, const std::set<std::string>& b) {
  a.insert(b.begin(), b.end());
  return a;
}

int Fail(const std::string& what) {
  std::fprintf(stderr, "deltactl: %s\n", what.c_str());
  return 1;
}
int Fail(const absl::Status& s) { return Fail(std::string(s.message())); }
// "UNAVAILABLE: <message>", with a hint where gRPC gives no message.
std::string Describe(const grpc::Status& s) {
  const auto code = static_cast<absl::StatusCode>(s.error_code());
  std::string msg = s.error_message();
  if (msg.empty()) {
    switch (s.error_code()) {
      case grpc::StatusCode::UNIMPLEMENTED:
        msg = "the server does not serve this API (wrong port? the public API is on --addr, "
              "Admin on --admin-addr)";
        break;
      case grpc::StatusCode::UNAVAILABLE:
        msg = "cannot reach the server";
        break;
      default:
        msg = "(no message from the server)";
    }
  }
  return absl::StrCat(absl::StatusCodeToString(code), ": ", msg);
}
// `request_id`: the public id ("gw-..."), when known, leads the message.
int Fail(const grpc::Status& s, const std::string& request_id = "") {
  return Fail(request_id.empty() ? Describe(s) : absl::StrCat("[", request_id, "] ", Describe(s)));
}

// The public request id of a finished call: from its messages, else the gateway's trailer.
std::string RequestIdOf(const grpc::ClientContext& ctx, const std::string& from_messages) {
  if (!from_messages.empty()) return from_messages;
  const auto& md = ctx.GetServerTrailingMetadata();
  auto it = md.find("x-request-id");
  return it == md.end() ? "" : std::string(it->second.data(), it->second.size());
}

void AddAuth(const Flags& f, grpc::ClientContext* ctx) {
  if (f.Has("--api-key")) ctx->AddMetadata("authorization", "Bearer " + f.Str("--api-key"));
}

void PrintStatus(const v1::ClusterStatus& s) {
  std::printf("model: %s | serving: %s | draining: %s\n", s.model().c_str(),
              s.serving() ? "yes" : "no", s.draining() ? "yes" : "no");
  std::printf("queue: %u waiting (capacity %u), %u running\n", s.waiting_requests(),
              s.queue_capacity(), s.running_requests());
  const v1::ContextPolicy& p = s.context_policy();
  std::printf("context: %s, total %u, slot cap %u | reserved %llu / %llu tokens\n",
              p.split() == v1::CONTEXT_SPLIT_STATIC ? "static" : "pool", p.total_context(),
              p.slot_cap(), static_cast<unsigned long long>(s.context_reserved()),
              static_cast<unsigned long long>(s.context_total()));
  // One line per replica (a worker or a TP group, each with its own slots and queue).
  std::printf(
      "\nREPLICA  WORKER                 DEVICE                 READY  HEARTBEAT  SLOTS  RUNNING  "
      "WAITING  WEIGHTS MiB  KV MiB  STATE MiB  WARMUP tok/s\n");
  for (const v1::WorkerStatus& w : s.workers())
    std::printf("%7u  %-22s %-22s %-6s %8.2fs  %5u  %7u  %7u  %11.1f  %6.1f  %9.1f  %12.1f\n",
                w.replica(), w.id().c_str(), w.device().c_str(), w.ready() ? "yes" : "no",
                w.heartbeat_age_seconds(), w.slots(), w.running_requests(), w.waiting_requests(),
                w.weights_bytes() / 1048576.0, w.kv_bytes() / 1048576.0,
                w.state_bytes() / 1048576.0, w.warmup_decode_tokens_per_second());
  if (s.workers().empty()) std::printf("(no worker)\n");
  // Prefix cache per replica (issue #17): hit rate over admissions, prompt tokens not prefilled.
  bool any_cache = false;
  for (const v1::WorkerStatus& w : s.workers()) any_cache |= w.prefix_cache().enabled();
  if (any_cache) {
    std::printf(
        "\nREPLICA  PREFIX CACHE  TIER    USED MiB  BUDGET MiB  CHECKPOINTS  HITS/LOOKUPS  HIT RATE  "
        "TOKENS SAVED  EVICTIONS\n");
    for (const v1::WorkerStatus& w : s.workers()) {
      const v1::PrefixCacheStatus& c = w.prefix_cache();
      if (!c.enabled()) {
        std::printf("%7u  off\n", w.replica());
        continue;
      }
      std::printf("%7u  on            %-6s  %8.1f  %10.1f  %11u  %5llu/%-6llu  %7.1f%%  %12llu  %9llu\n",
                  w.replica(), c.tier().c_str(), c.bytes() / 1048576.0,
                  c.budget_bytes() / 1048576.0, c.checkpoints(),
                  static_cast<unsigned long long>(c.hits()),
                  static_cast<unsigned long long>(c.lookups()),
                  c.lookups() ? 100.0 * c.hits() / c.lookups() : 0.0,
                  static_cast<unsigned long long>(c.tokens_saved()),
                  static_cast<unsigned long long>(c.evictions()));
    }
  }
  std::printf("\nSLOT  REQUEST               USED  RESERVED    CAP  STATE\n");
  for (const v1::SlotStatus& sl : s.slots())
    std::printf("%4u  %-20llu %5u  %8u  %5u  %s\n", sl.index(),
                static_cast<unsigned long long>(sl.request_id()), sl.context_used(),
                sl.context_reserved(), sl.context_cap(),
                sl.retiring() ? "retiring" : (sl.request_id() ? "busy" : "idle"));
}

int CmdGenerate(int argc, char** argv) {
  auto f = Flags::Parse(
      argc, argv,
      With({"--addr", "--prompt", "--prompt-ids", "--chat-user", "--chat-system", "--max-tokens",
            "--temperature", "--top-k", "--top-p", "--min-p", "--seed", "--stop", "--stop-id",
            "--logprobs", "--priority", "--timeout", "--api-key", "--request-id"},
           kTlsFlags),
      {"--ignore-eos", "--show-ids", "--ids-only", "--tls"});
  if (!f.ok()) return Fail(f.status());
  const int n_prompts = f->Has("--prompt") + f->Has("--prompt-ids") + f->Has("--chat-user");
  if (n_prompts != 1) return Fail("give exactly one of --prompt, --prompt-ids, --chat-user");
  v1::GenerateRequest req;
  if (f->Has("--prompt")) {
    req.set_text(f->Str("--prompt"));
  } else if (f->Has("--prompt-ids")) {
    auto ids = ds::ctl::ParseIds(f->Str("--prompt-ids"));
    if (!ids.ok()) return Fail(ids.status());
    req.mutable_token_ids()->mutable_ids()->Add(ids->begin(), ids->end());
  } else {
    if (f->Has("--chat-system")) {
      auto* m = req.mutable_chat()->add_messages();
      m->set_role("system");
      m->set_content(f->Str("--chat-system"));
    }
    auto* m = req.mutable_chat()->add_messages();
    m->set_role("user");
    m->set_content(f->Str("--chat-user"));
  }
  // Range checks of meaning are the gateway's job (it names the field); here every value must fit
  // its wire type exactly, so nothing is wrapped or truncated on the way.
  constexpr double kFloatMax = 3.4e38;
  auto max_tokens = f->Int("--max-tokens", 0, 0, UINT32_MAX);
  auto temp = f->Float("--temperature", 0, -kFloatMax, kFloatMax);
  auto top_k = f->Int("--top-k", 0, INT32_MIN, INT32_MAX);
  auto top_p = f->Float("--top-p", 0, -kFloatMax, kFloatMax);
  auto min_p = f->Float("--min-p", 0, -kFloatMax, kFloatMax);
  auto seed = f->Uint("--seed", 0);
  auto logprobs = f->Int("--logprobs", 0, 0, UINT32_MAX);
  auto priority = f->Int("--priority", 0, INT32_MIN, INT32_MAX);
  auto timeout = f->Float("--timeout", 600, 0.001, 1e7);
  for (const absl::Status& s :
       {max_tokens.status(), temp.status(), top_k.status(), top_p.status(), min_p.status(),
        seed.status(), logprobs.status(), priority.status(), timeout.status()})
    if (!s.ok()) return Fail(s);
  req.set_max_tokens(static_cast<uint32_t>(*max_tokens));
  req.mutable_sampling()->set_temperature(static_cast<float>(*temp));
  req.mutable_sampling()->set_top_k(static_cast<int32_t>(*top_k));
  req.mutable_sampling()->set_top_p(static_cast<float>(*top_p));
  req.mutable_sampling()->set_min_p(static_cast<float>(*min_p));
  req.mutable_sampling()->set_seed(static_cast<uint64_t>(*seed));
  for (const std::string& s : f->All("--stop")) req.add_stop(s);
  for (const std::string& s : f->All("--stop-id")) {
    auto ids = ds::ctl::ParseIds(s);
    if (!ids.ok()) return Fail(ids.status());
    for (int32_t id : *ids) req.add_stop_token_ids(id);
  }
  req.set_logprobs(static_cast<uint32_t>(*logprobs));
  req.set_priority(static_cast<int32_t>(*priority));
  req.set_ignore_eos(f->Has("--ignore-eos"));
  req.set_request_id(f->Str("--request-id"));
  const bool show_ids = f->Has("--show-ids");
  // Scripts: stdout is only the generated ids, "1,2,3\n" once the request finished.
  const bool ids_only = f->Has("--ids-only");
  std::vector<int32_t> ids;

  auto channel = PublicChannel(*f);
  if (!channel.ok()) return Fail(channel.status());
  auto stub = v1::Generation::NewStub(*channel);
  grpc::ClientContext ctx;
  AddAuth(*f, &ctx);
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(static_cast<int64_t>(*timeout * 1e3)));
  auto reader = stub->Generate(&ctx, req);
  v1::GenerateResponse msg;
  std::string request_id;
  while (reader->Read(&msg)) {
    request_id = msg.request_id();
    if (msg.has_chunk()) {
      const auto& c = msg.chunk();
      if (ids_only) {
        ids.insert(ids.end(), c.token_ids().begin(), c.token_ids().end());
        continue;
      }
      if (!c.text().empty()) std::fwrite(c.text().data(), 1, c.text().size(), stdout);
      if (show_ids) {
        for (int32_t id : c.token_ids()) std::printf("[%d]", id);
      }
      for (const v1::TokenLogprob& lp : c.logprobs()) {
        std::fprintf(stderr, "\n  logprob id %d = %.4f top:", lp.token_id(), lp.logprob());
        for (const auto& t : lp.top()) std::fprintf(stderr, " %d:%.3f", t.token_id(), t.logprob());
      }
      std::fflush(stdout);
    } else if (msg.has_finished()) {
      const auto& fin = msg.finished();
      if (ids_only)
        for (size_t i = 0; i < ids.size(); ++i) std::printf("%s%d", i ? "," : "", ids[i]);
      std::printf("\n");
      std::fprintf(
          stderr,
          "[%s] %s%s%s | prompt %u tok, generated %u tok | server: queue %.1f ms, TTFT "
          "%.1f ms, mean inter-token %.2f ms, total %.1f ms\n",
          msg.request_id().c_str(), v1::FinishReason_Name(fin.reason()).c_str(),
          fin.stop_string().empty() ? "" : " on ",
          fin.stop_string().empty() ? "" : ("'" + fin.stop_string() + "'").c_str(),
          fin.usage().prompt_tokens(), fin.usage().completion_tokens(),
          fin.timings().queue_seconds() * 1e3, fin.timings().time_to_first_token_seconds() * 1e3,
          fin.timings().mean_inter_token_seconds() * 1e3, fin.timings().total_seconds() * 1e3);
    }
  }
  grpc::Status s = reader->Finish();
  if (!s.ok()) {
    if (!request_id.empty() && !ids_only) std::printf("\n");
    return Fail(s, RequestIdOf(ctx, request_id));
  }
  return 0;
}

int CmdTokenize(int argc, char** argv) {
  auto f = Flags::Parse(argc, argv, With({"--addr", "--prompt", "--chat-user", "--api-key"}, kTlsFlags),
                        {"--tls"});
  if (!f.ok()) return Fail(f.status());
  v1::TokenizeRequest req;
  if (f->Has("--prompt")) {
    req.set_text(f->Str("--prompt"));
  } else if (f->Has("--chat-user")) {
    auto* m = req.mutable_chat()->add_messages();
    m->set_role("user");
    m->set_content(f->Str("--chat-user"));
  } else {
    return Fail("give --prompt or --chat-user");
  }
  auto channel = PublicChannel(*f);
  if (!channel.ok()) return Fail(channel.status());
  auto stub = v1::Generation::NewStub(*channel);
  grpc::ClientContext ctx;
  AddAuth(*f, &ctx);
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::TokenizeResponse resp;
  grpc::Status s = stub->Tokenize(&ctx, req, &resp);
  if (!s.ok()) return Fail(s);
  for (int i = 0; i < resp.ids_size(); ++i) std::printf("%s%d", i ? "," : "", resp.ids(i));
  std::printf("\n");
  return 0;
}

int CmdHealth(int argc, char** argv) {
  auto f = Flags::Parse(argc, argv, With({"--addr"}, kTlsFlags), {"--tls"});
  if (!f.ok()) return Fail(f.status());
  auto ch = PublicChannel(*f);
  if (!ch.ok()) return Fail(ch.status());
  const ds::gw::Health h = ds::gw::CheckHealth(ch->get(), std::chrono::seconds(5));
  std::printf("%s\n", ds::gw::HealthName(h));
  return h == ds::gw::Health::kServing ? 0 : 1;
}

// status / set-slots / set-context / drain: one admin call, then the status table.
int CmdAdmin(const std::string& cmd, int argc, char** argv) {
  std::string positional;
  if (cmd == "set-slots" && argc > 0 && std::strncmp(argv[0], "--", 2) != 0) {
    positional = argv[0];
    --argc;
    ++argv;
  }
  auto f = Flags::Parse(
      argc, argv, {"--admin-addr", "--slots", "--split", "--total", "--slot-cap", "--api-key"},
      {"--resume"});
  if (!f.ok()) return Fail(f.status());
  auto stub = v1::Admin::NewStub(ds::gw::MakeChannel(f->Str("--admin-addr", kDefaultAdminAddr)));
  grpc::ClientContext ctx;
  AddAuth(*f, &ctx);
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::ClusterStatus st;
  grpc::Status s;
  if (cmd == "status") {
    s = stub->GetClusterStatus(&ctx, v1::GetClusterStatusRequest(), &st);
  } else if (cmd == "set-slots") {
    const std::string n = positional.empty() ? f->Str("--slots") : positional;
    if (n.empty()) return Fail("set-slots needs a slot count N >= 1");
    // The scheduler refuses 0 (a cluster with no slot serves nothing) and bounds the top by the
    // worker's configured slots; the wire field is 32 bits.
    auto v = ds::ctl::ParseInt("set-slots N", n, 1, UINT32_MAX);
    if (!v.ok()) return Fail(v.status());
    v1::SetSlotsRequest req;
    req.set_slots(static_cast<uint32_t>(*v));
    s = stub->SetSlots(&ctx, req, &st);
  } else if (cmd == "set-context") {
    v1::SetContextPolicyRequest req;
    const std::string split = f->Str("--split");
    if (split == "static") {
      req.mutable_policy()->set_split(v1::CONTEXT_SPLIT_STATIC);
    } else if (split == "pool") {
      req.mutable_policy()->set_split(v1::CONTEXT_SPLIT_POOL);
    } else {
      return Fail("set-context needs --split static|pool");
    }
    if (!f->Has("--total")) return Fail("set-context needs --total N >= 1");
    auto total = f->Int("--total", 0, 1, UINT32_MAX);
    auto cap = f->Int("--slot-cap", 0, 0, UINT32_MAX);
    if (!total.ok()) return Fail(total.status());
    if (!cap.ok()) return Fail(cap.status());
    req.mutable_policy()->set_total_context(static_cast<uint32_t>(*total));
    req.mutable_policy()->set_slot_cap(static_cast<uint32_t>(*cap));
    s = stub->SetContextPolicy(&ctx, req, &st);
  } else {
    v1::DrainRequest req;
    req.set_resume(f->Has("--resume"));
    s = stub->Drain(&ctx, req, &st);
  }
  if (!s.ok()) return Fail(s);
  PrintStatus(st);
  return 0;
}

// One Generate shaped like the load's requests (prompt of prompt_len ids below vocab, max_tokens,
// ignore_eos): the reason of its failure ("" when it succeeds).
int CmdLoad(int argc, char** argv) {
  auto f = Flags::Parse(argc, argv,
                        With({"--addr", "--concurrency", "--requests", "--prompt-len", "--max-tokens",
                         "--seed", "--vocab", "--timeout", "--api-key", "--reject-backoff-ms",
                         "--shared-prefix", "--prompt-len-max"},
                              kTlsFlags),
                        {"--no-ignore-eos", "--tls"});
  if (!f.ok()) return Fail(f.status());
  ds::loadgen::LoadOptions o;
  o.addr = f->Str("--addr", kDefaultAddr);
  auto c = f->Int("--concurrency", 1, 1, 100000), n = f->Int("--requests", 16, 1, INT32_MAX),
       l = f->Int("--prompt-len", 32, 1, INT32_MAX), m = f->Int("--max-tokens", 32, 1, INT32_MAX),
       vocab = f->Int("--vocab", 256, 1, INT32_MAX);
  auto seed = f->Uint("--seed", 1);
  auto timeout = f->Float("--timeout", 300, 0.001, 1e7);
  auto backoff = f->Int("--reject-backoff-ms", 20, 0, 3600000);
  auto shared = f->Int("--shared-prefix", 0, 0, INT32_MAX);
  auto lmax = f->Int("--prompt-len-max", 0, 0, INT32_MAX);
  if (!shared.ok()) return Fail(shared.status());
  if (!lmax.ok()) return Fail(lmax.status());
  o.shared_prefix = static_cast<int>(*shared);
  o.prompt_len_max = static_cast<int>(*lmax);
  for (const absl::Status& s : {c.status(), n.status(), l.status(), m.status(), seed.status(),
                                vocab.status(), timeout.status(), backoff.status()})
    if (!s.ok()) return Fail(s);
  o.concurrency = static_cast<int>(*c);
  o.requests = static_cast<int>(*n);
  o.prompt_len = static_cast<int>(*l);
  o.max_tokens = static_cast<int>(*m);
  o.seed = static_cast<uint64_t>(*seed);
  o.vocab = static_cast<int>(*vocab);
  o.timeout_s = *timeout;
  o.reject_backoff_ms = static_cast<int>(*backoff);
  o.ignore_eos = !f->Has("--no-ignore-eos");
  o.api_key = f->Str("--api-key");
  o.tls.tls = f->Has("--tls") || f->Has("--ca-file");
  if (!o.tls.tls)
    for (const std::string& flag : kTlsFlags)
      if (f->Has(flag)) return Fail(absl::InvalidArgumentError(flag + " needs --tls or --ca-file"));
  o.tls.ca_file = f->Str("--ca-file");
  o.tls.server_name = f->Str("--server-name");
  o.tls.cert_file = f->Str("--cert");
  o.tls.key_file = f->Str("--key");
  auto r = ds::loadgen::RunLoad(o);
  if (!r.ok()) return Fail(r.status());
  // The report gives each failure code's first message ("first UNAVAILABLE: ...").
  std::printf("%s", ds::loadgen::FormatReport(*r).c_str());
  return r->ok > 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    Usage(stderr);
    return 2;
  }
  // --help anywhere (deltactl --help, deltactl set-slots --help): usage on stdout, exit 0.
  if (ds::config::HelpRequested(argc - 1, argv + 1)) {
    Usage(stdout);
    return 0;
  }
  const std::string cmd = argv[1];
  if (cmd == "generate") return CmdGenerate(argc - 2, argv + 2);
  if (cmd == "tokenize") return CmdTokenize(argc - 2, argv + 2);
  if (cmd == "health") return CmdHealth(argc - 2, argv + 2);
  if (cmd == "status" || cmd == "set-slots" || cmd == "set-context" || cmd == "drain")
    return CmdAdmin(cmd, argc - 2, argv + 2);
  if (cmd == "load") return CmdLoad(argc - 2, argv + 2);
  std::fprintf(stderr, "deltactl: unknown command '%s'\n", cmd.c_str());
  Usage(stderr);
  return 2;
}
