#include "tools/serve/serve.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/config/config_file.h"
#include "common/config/role.h"
#include "deltaserve/v1/deltaserve.grpc.pb.h"
#include "gateway/client.h"
#include "gateway/gateway.h"
#include "tools/serve/children.h"
#include "worker/backend_factory.h"
#include "worker/model/kv_type.h"
#include "worker/process/device_tuning.h"
#include "worker/spec/mtp_setting.h"
#include "common/util/model_alias.h"

namespace ds {
namespace {

namespace v1 = deltaserve::v1;
using serve::Child;
using std::chrono::milliseconds;

constexpr milliseconds kStartTimeout{30'000};     // a role's port file
constexpr milliseconds kServingTimeout{300'000};  // worker load + warmup (27B on a GPU: minutes)
constexpr milliseconds kStopGrace{10'000};

struct ServeOptions {
  std::string model;
  int workers = 1;       // replicas: independent workers (or TP groups) under one scheduler
  int tp = 1;            // worker processes per replica, one TP group each (docs/tp.md §6)
  std::vector<int> gpus; // CUDA device of every rank, replica by replica; empty = --device 0
  double failover_wait = 60;  // a lost replica's requests wait this long for one (0 = fail)
  std::string tp_split;  // TP share weights ("1,2") or "mem"; empty = even
  std::string tp_collective;  // worker --tp-collective (auto|custom|nccl|gloo); empty = auto
  int slots = 4;
  int ctx = 4096;
  std::string split = "pool";
  int slot_cap = 0;  // --slot-cap: pool split, the most positions one request may hold (0: --ctx)
  std::string backend = "auto";
  std::string kv_type = "f16";  // f16 | q8_0 | q4_0 (worker --kv-type; quantized needs CUDA)
  DeviceTuning tuning;  // the workers' device switches, passed on as given (device_tuning.h)
  std::string mtp = "off";      // worker --mtp K|auto|off (MTP speculative decoding, issue #15)
  int max_active = 0;           // worker --max-active N (state for N sequences at once; 0 = all)
  // Paged KV pool (worker --kv-pool-tokens; 0 = what fits) and the share of its GPU each worker
  // plans for (0 = 1 / the number of worker processes on that GPU).
  std::string kv_pool_tokens;
  double memory_fraction = 0;
  std::string max_step_tokens;  // worker --max-step-tokens (empty = its default)
  std::string overcommit_headroom;  // scheduler --overcommit-headroom (empty = off)
  // Prefix cache (issue #17): --prefix-cache on|off (both roles), worker --prefix-cache-mb N and
  // --prefix-cache-tier auto|host|device; empty = the roles' defaults.
  std::string prefix_cache, prefix_cache_mb, prefix_cache_tier;
  int port = 50051;
  int max_inflight = 64;
  int threads = 0;
  bool demo = false;
  std::string demo_prompt;
  std::string demo_chat;  // --demo-chat: a second demo request, one user message (ChatML)
  int demo_max_tokens = 48;
  int metrics_port = -1;  // -1: no /metrics; P: scheduler P, gateway P+1, worker P+2; 0: any
  int http_port = -1;     // -1: no OpenAI HTTP API; P: the gateway's on 127.0.0.1:P; 0: any
  std::string api_key_file, admin_key_file, tls_cert, tls_key, nvml_device;
};

void Usage(FILE* out) {
  std::fprintf(
      out,
      "usage: deltaserve serve --model FILE [--workers N | --gpus 0,1,...] [--slots N] [--ctx N] "
      "[--split static|pool] [--backend cpu|cuda|auto] [--port P] [--max-inflight N] "
      "[--threads N] [--tp N [--split 1,2|mem] [--tp-collective auto|custom|nccl|gloo]] "
      "[--demo PROMPT [--demo-chat MESSAGE] [--demo-max-tokens N]]\n"
      "  [--max-active N]  recurrent state for N sequences at once (0 = every slot): "
      "fewer than --slots caps the running slots at N\n"
      "  [--mtp K|auto|off]  MTP speculative decoding: each decode verifies K drafts of "
      "the model's MTP head (auto: fewer as the batch grows); same tokens as off\n"
      "  [--deferred-drafts on|off]  with --mtp: the drafts stay on the device for the "
      "slot's next verify (no host wait for them; same tokens; default on)\n"
      "  [--judged-chains on|off]  with --mtp on CUDA: each verify's next draft chain "
      "runs right behind it and judges its drafts on the device (same tokens; default "
      "on)\n"
      "  [--portable on|off]  the CUDA workers run the sm_70 (V100) kernels on any GPU "
      "(taken anyway below sm_80; docs/v100.md)\n"
      "  [--dense-weights on|off|auto]  the CUDA workers also keep a 16-bit copy of every "
      "layer matrix (~2 bytes per weight) for prefill without per-step dequantization; "
      "auto (default): only where the KV pool loses nothing by it; on: also for batched "
      "decode of 33+ streams, at the pool's expense (H200, 27B Q6_K: pp512 1.5x, x64 "
      "1.2x)\n"
      "  [--early-launch on|off]  the CUDA workers launch decode kernels while the one "
      "before them finishes (sm_90+, default on; off: plain launches)\n"
      "  [--tiled-f16-formats on|off]  the CUDA workers tile Q4_K / Q5_K / Q8_0 / IQ4_XS / "
      "IQ4_NL matrices for the f16 tensor-core kernel too (default on: H200 27B x16 "
      "2.3-3.3x; off: the raw layout's GEMV, docs/perf/h200.md)\n"
      "  [--f16-wgmma on|off]  the CUDA workers run that kernel on Hopper's wgmma "
      "(sm_90a builds; default on: the same numbers, x64 +8%% on an H100; off: mma.sync)\n"
      "  [--prefill-fp8 on|off]  the CUDA workers run prefill products on FP8 tensor "
      "cores (Hopper; lossy: demo perplexity +0.16%%; H200 27B pp8192 9,114 -> 12,282 "
      "tok/s; default off; docs/quality.md)\n"
      "  [--fp8-decode-rows N]  with --prefill-fp8 on, decode steps of N or more "
      "sequences on FP8 too (default 33: H100 x40-x64 +10%%, x16-x32 behind; 0: never)\n"
      "  [--coarse-draft-head on|off]  with --mtp, drafts through a 4-bit copy of a "
      "Q6_K lm_head (default on; the outputs are the verified ones either way)\n"
      "  [--gdn-state f32|bf16]  the workers store the GDN recurrent state in bf16 "
      "between steps (f32 arithmetic; half its memory and its traffic in batched decode; "
      "default f32; docs/quality.md)\n"
      "  [--kv-type f16|q8_0|q4_0]  KV cache element type on the CUDA backend: q8_0 = "
      "8.5 bits, q4_0 = 4.5 bits per element (~1.9x / ~3.6x the --ctx at the same KV "
      "memory); the CPU backend keeps f32 KV and refuses q8_0/q4_0\n"
      "  [--slot-cap N]  with --split pool: the most positions one request may hold "
      "(default --ctx), e.g. --ctx 2000000 --slot-cap 131072: many short and a few long "
      "requests in one pool\n"
      "  [--kv-pool-tokens N] [--memory-fraction F]  the KV pool the slots share (default: "
      "what the worker's memory plan finds room for) and each worker's share of its GPU "
      "(default: 1 / the workers on it); [--max-step-tokens N] rows per CUDA micro-step "
      "(less workspace, more KV pool; default 4096); [--overcommit-headroom N] the pool "
      "split reserves known tokens + N and preempts the youngest when the KV pool is short\n"
      "  [--prefix-cache on|off] [--prefix-cache-mb N] [--prefix-cache-tier auto|host|device]  "
      "checkpoints of sequence state (KV + DeltaNet state) at exact token positions, so "
      "a chat's next turn and requests sharing a prefix skip its prefill (default on, "
      "4096 MiB per worker, device memory where the backend can)\n"
      "  [--http-port P]  the OpenAI-compatible HTTP API (/v1/chat/completions, "
      "/v1/completions, /v1/models, /health) on 127.0.0.1:P (0: any free port)\n"
      "  [--metrics-port P] [--api-key-file F] [--admin-key-file F] "
      "[--tls-cert F --tls-key F] [--nvml-device N|off]\n"
      "  [--failover-wait S]  how long the requests of a lost replica wait when no other "
      "replica can take them (default 60; 0 = fail at once)\n"
      "  --workers N: N replicas (workers or --tp groups), each with its own slots; --gpus "
      "gives every rank its own GPU (replica by replica); a dead worker is restarted\n"
      "  starts scheduler, worker and gateway as child processes; the gateway listens on "
      "127.0.0.1:P (admin P+1; --port 0 picks free ports); a port in use is an error\n"
      "  with --api-key-file or --admin-key-file, the scheduler's internal port takes only a\n"
      "  key generated for this run (mode 0600 in the run's directory)\n");
}

absl::StatusOr<ServeOptions> Parse(int argc, char** argv) {
  std::set<std::string> known = {
      "--model", "--workers",      "--slots",   "--ctx",  "--split",          "--backend",
      "--port",  "--max-inflight", "--threads", "--demo", "--demo-chat", "--demo-max-tokens", "--tp",
      "--tp-split", "--kv-type", "--gpus", "--failover-wait", "--tp-collective",
      "--kv-pool-tokens", "--memory-fraction", "--max-step-tokens", "--overcommit-headroom",
      "--slot-cap", "--mtp", "--max-active", "--prefix-cache", "--prefix-cache-mb",
      "--prefix-cache-tier",
      // operations: metrics ports, API keys, TLS, GPU metrics (deploy/README.md)
      "--metrics-port", "--api-key-file", "--admin-key-file", "--tls-cert", "--tls-key",
      "--nvml-device", "--http-port"};
  known.insert(DeviceTuningFlagNames().begin(), DeviceTuningFlagNames().end());
  DS_ASSIGN_OR_RETURN(auto m, config::ParseFlagPairs(argc, argv, known));
  ServeOptions o;
  if (!m.count("--model")) return absl::InvalidArgumentError("--model FILE is required");
  o.model = ResolveModelAlias(m["--model"]);  // "demo": models/demo/
  auto integer = [&](const char* f, int* v, int lo) -> absl::Status {
    if (m.count(f) && (!absl::SimpleAtoi(m[f], v) || *v < lo))
      return absl::InvalidArgumentError(
          absl::StrCat(f, " expects an integer >= ", lo, ", got '", m[f], "'"));
    return absl::OkStatus();
  };
  DS_RETURN_IF_ERROR(integer("--workers", &o.workers, 1));
  DS_RETURN_IF_ERROR(integer("--tp", &o.tp, 1));
  DS_RETURN_IF_ERROR(integer("--slots", &o.slots, 1));
  DS_RETURN_IF_ERROR(integer("--ctx", &o.ctx, 1));
  DS_RETURN_IF_ERROR(integer("--slot-cap", &o.slot_cap, 0));
  DS_RETURN_IF_ERROR(integer("--port", &o.port, 0));
  DS_RETURN_IF_ERROR(integer("--max-inflight", &o.max_inflight, 1));
  DS_RETURN_IF_ERROR(integer("--threads", &o.threads, 0));
  DS_RETURN_IF_ERROR(integer("--demo-max-tokens", &o.demo_max_tokens, 1));
  DS_RETURN_IF_ERROR(integer("--metrics-port", &o.metrics_port, 0));
  DS_RETURN_IF_ERROR(integer("--http-port", &o.http_port, 0));
  if (o.http_port > 65535) return absl::InvalidArgumentError("--http-port must be <= 65535");
  if (o.metrics_port > 65533)
    return absl::InvalidArgumentError(
        "--metrics-port must be <= 65533 (the workers get P+2, P+3, ...)");
  for (auto [flag, field] : {std::pair{"--api-key-file", &o.api_key_file},
                             {"--admin-key-file", &o.admin_key_file},
                             {"--tls-cert", &o.tls_cert},
                             {"--tls-key", &o.tls_key},
                             {"--nvml-device", &o.nvml_device}})
    if (m.count(flag)) *field = m[flag];
  if (o.port > 65534) return absl::InvalidArgumentError("--port must be <= 65534 (admin is P+1)");
  if (m.count("--kv-pool-tokens")) o.kv_pool_tokens = m["--kv-pool-tokens"];
  if (m.count("--max-step-tokens")) o.max_step_tokens = m["--max-step-tokens"];
  if (m.count("--overcommit-headroom")) o.overcommit_headroom = m["--overcommit-headroom"];
  if (m.count("--prefix-cache")) o.prefix_cache = m["--prefix-cache"];
  if (m.count("--prefix-cache-mb")) o.prefix_cache_mb = m["--prefix-cache-mb"];
  if (m.count("--prefix-cache-tier")) o.prefix_cache_tier = m["--prefix-cache-tier"];
  if (m.count("--memory-fraction") &&
      (!absl::SimpleAtod(m["--memory-fraction"], &o.memory_fraction) || o.memory_fraction <= 0 ||
       o.memory_fraction > 1))
    return absl::InvalidArgumentError("--memory-fraction expects a number in (0, 1], got '" +
                                      m["--memory-fraction"] + "'");
  if (m.count("--failover-wait") &&
      (!absl::SimpleAtod(m["--failover-wait"], &o.failover_wait) || o.failover_wait < 0))
    return absl::InvalidArgumentError("--failover-wait expects seconds >= 0, got '" +
                                      m["--failover-wait"] + "'");
  if (m.count("--gpus")) {
    for (absl::string_view g : absl::StrSplit(m["--gpus"], ',')) {
      int d = -1;
      if (!absl::SimpleAtoi(g, &d) || d < 0)
        return absl::InvalidArgumentError("--gpus expects GPU indices like 0,1, got '" +
                                          m["--gpus"] + "'");
      o.gpus.push_back(d);
    }
    // Every rank gets its own GPU: --gpus 0,1 is two replicas, --gpus 0,1,2,3 --tp 2 two groups.
    if (!m.count("--workers")) o.workers = static_cast<int>(o.gpus.size()) / o.tp;
    if (o.workers < 1 || static_cast<int>(o.gpus.size()) != o.workers * o.tp)
      return absl::InvalidArgumentError(absl::StrCat(
          "--gpus lists ", o.gpus.size(), " GPUs for ", o.workers, " replica(s) of ", o.tp,
          " rank(s): give exactly one GPU per rank"));
  }
  // --split is the context split (static|pool) or, with --tp > 1, the TP share weights
  // ("1,1", "1:1.5", "mem"; also --tp-split); the worker ranks validate the weights.
  if (m.count("--split") && o.tp > 1 && m["--split"] != "static" && m["--split"] != "pool") {
    o.tp_split = m["--split"];
    m.erase("--split");
  }
  if (m.count("--tp-split")) o.tp_split = m["--tp-split"];
  // CUDA ranks: auto = the custom IPC all-reduce (ranks may share a GPU, --gpus 0,0; NCCL when
  // the group spans hosts), gloo = Gloo behind the host-staged collective; the worker validates.
  if (m.count("--tp-collective")) o.tp_collective = m["--tp-collective"];
  if (!o.tp_split.empty() && o.tp == 1)
    return absl::InvalidArgumentError("TP share weights need --tp > 1");
  if (m.count("--split")) o.split = m["--split"];
  if (o.split != "static" && o.split != "pool")
    return absl::InvalidArgumentError("--split expects static or pool, got '" + o.split + "'");
  if (m.count("--backend")) o.backend = m["--backend"];
  if (o.backend != "cpu" && o.backend != "cuda" && o.backend != "auto")
    return absl::InvalidArgumentError("--backend expects cpu, cuda or auto, got '" + o.backend +
                                      "'");
  if (m.count("--kv-type")) o.kv_type = m["--kv-type"];
  DS_RETURN_IF_ERROR(ParseDeviceTuning(m, &o.tuning));
  DS_RETURN_IF_ERROR(integer("--max-active", &o.max_active, 0));
  if (m.count("--mtp")) {
    o.mtp = m["--mtp"];
    DS_RETURN_IF_ERROR(spec::ParseMtpSetting(o.mtp).status());
  }
  if (!KvTypeFromName(o.kv_type))
    return absl::InvalidArgumentError("--kv-type expects f16, q8_0 or q4_0, got '" + o.kv_type +
                                      "'");
  if (o.kv_type != "f16" && o.backend == "cpu")
    return absl::InvalidArgumentError("--kv-type " + o.kv_type +
                                      " needs --backend cuda (or auto on a GPU host): the CPU "
                                      "backend keeps its KV cache in f32");
  if (m.count("--demo")) {
    o.demo = true;
    o.demo_prompt = m["--demo"];
    // A demo is a one-shot run: free ports unless asked, so it never collides with a server.
    if (!m.count("--port")) o.port = 0;
  }
  if (m.count("--demo-chat")) {
    if (!o.demo) return absl::InvalidArgumentError("--demo-chat needs --demo PROMPT");
    o.demo_chat = m["--demo-chat"];
  }
  if (o.metrics_port > 0 && o.metrics_port + 1 + o.workers * o.tp > 65535)
    return absl::InvalidArgumentError(absl::StrCat(
        "--metrics-port ", o.metrics_port, ": the ", o.workers * o.tp,
        " worker processes would need ports up to ", o.metrics_port + 1 + o.workers * o.tp));
  if (!std::filesystem::exists(o.model))
    return absl::NotFoundError("--model: no such file '" + o.model + "'");
  return o;
}

// One streamed Generate through the gateway, text to stdout as it arrives: the --demo text as a
// plain prompt, then the --demo-chat message as a chat turn. Sampling suits the small demo model
// (models/demo/README.md: greedy decoding repeats itself).
int RunDemoRequest(const std::string& addr, const ServeOptions& o, bool chat);
int RunDemo(const std::string& addr, const ServeOptions& o) {
  const int rc = RunDemoRequest(addr, o, /*chat=*/false);
  if (rc != 0 || o.demo_chat.empty()) return rc;
  return RunDemoRequest(addr, o, /*chat=*/true);
}

int RunDemoRequest(const std::string& addr, const ServeOptions& o, bool chat) {
  auto stub = v1::Generation::NewStub(gw::MakeChannel(addr));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(300));
  v1::GenerateRequest req;
  if (chat) {
    v1::ChatMessage* m = req.mutable_chat()->add_messages();
    m->set_role("user");
    m->set_content(o.demo_chat);
  } else {
    req.set_text(o.demo_prompt);
  }
  req.set_max_tokens(static_cast<uint32_t>(o.demo_max_tokens));
  req.mutable_sampling()->set_temperature(0.8f);
  req.mutable_sampling()->set_top_p(0.95f);
  req.mutable_sampling()->set_repetition_penalty(1.1f);
  req.mutable_sampling()->set_seed(7);
  if (chat) {
    std::printf("\nchat, user: %s\nassistant: ", o.demo_chat.c_str());
  } else {
    std::printf("prompt: %s\n", o.demo_prompt.c_str());
  }
  std::fflush(stdout);
  auto reader = stub->Generate(&ctx, req);
  v1::GenerateResponse msg;
  v1::GenerateResponse::Finished fin;
  bool have_fin = false;
  while (reader->Read(&msg)) {
    if (msg.has_chunk()) {
      std::fwrite(msg.chunk().text().data(), 1, msg.chunk().text().size(), stdout);
      std::fflush(stdout);
    } else if (msg.has_finished()) {
      fin = msg.finished();
      have_fin = true;
    }
  }
  grpc::Status s = reader->Finish();
  std::printf("\n");
  if (!s.ok()) {
    std::fprintf(stderr, "deltaserve serve: demo request failed: %s: %s\n",
                 std::to_string(s.error_code()).c_str(), s.error_message().c_str());
    return 1;
  }
  if (have_fin) {
    const v1::Timings& t = fin.timings();
    std::fprintf(stderr,
                 "[demo] %s | prompt %u tok, generated %u tok | server: queue %.1f ms, TTFT %.1f "
                 "ms, mean inter-token %.1f ms, total %.1f ms\n",
                 v1::FinishReason_Name(fin.reason()).c_str(), fin.usage().prompt_tokens(),
                 fin.usage().completion_tokens(), t.queue_seconds() * 1e3,
                 t.time_to_first_token_seconds() * 1e3, t.mean_inter_token_seconds() * 1e3,
                 t.total_seconds() * 1e3);
  }
  return 0;
}

// A random bearer token (32 bytes, hex) in `dir`/internal.key, created with mode 0600.
absl::StatusOr<std::string> WriteInternalKey(const std::string& dir) {
  unsigned char raw[32];
  std::FILE* r = std::fopen("/dev/urandom", "rb");
  const bool got = r && std::fread(raw, 1, sizeof raw, r) == sizeof raw;
  if (r) std::fclose(r);
  if (!got) return absl::InternalError("cannot read /dev/urandom for the internal key");
  std::string token;
  for (unsigned char b : raw) absl::StrAppend(&token, absl::Hex(b, absl::kZeroPad2));
  const std::string path = dir + "/internal.key";
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
  if (fd < 0) return absl::InternalError("cannot create " + path + ": " + std::strerror(errno));
  const std::string line = token + "\n";
  const bool ok = write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
  close(fd);
  if (!ok) return absl::InternalError("cannot write " + path);
  return path;
}

// The port file of the k-th worker process (k >= 1; the first one's is worker.port).
std::string WorkerPortFile(const std::string& dir, int k) {
  return absl::StrCat(dir, "/worker", k, ".port");
}

int ReadPort(const std::string& text, int index) {
  std::istringstream in(text);
  int p = 0;
  for (int i = 0; i <= index; ++i)
    if (!(in >> p)) return 0;
  return p;
}

}  // namespace

int RunGateway(int argc, char** argv) { return gw::RunGatewayMain(argc, argv); }

int RunServe(int argc, char** argv) {
  if (config::HelpRequested(argc, argv)) {
    Usage(stdout);
    return 0;
  }
  absl::StatusOr<ServeOptions> o = Parse(argc, argv);
  if (!o.ok()) {
    std::fprintf(stderr, "deltaserve serve: %s\n", std::string(o.status().message()).c_str());
    Usage(stderr);
    return 2;
  }
  // SIGINT/SIGTERM are taken with sigtimedwait between child checks (children unblock them).
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);

  char dir_template[] = "/tmp/deltaserve-serve-XXXXXX";
  if (!mkdtemp(dir_template)) {
    std::perror("deltaserve serve: mkdtemp");
    return 1;
  }
  const std::string dir = dir_template;
  // A CUDA TP rank gets a GPU of its own (NCCL refuses two ranks on one device; several ranks on
  // one GPU only make sense for tests, --gpus 0,0 with the default collective): without --gpus,
  // rank r of replica i takes GPU i * tp + r, and too few GPUs is an error that says so.
  if (o->gpus.empty() && o->tp > 1 && o->backend != "cpu") {
    const int n_gpus = CudaDeviceCount(), ranks = o->workers * o->tp;
    if (n_gpus > 0 && n_gpus < ranks) {
      std::fprintf(stderr,
                   "deltaserve serve: --tp %d x %d replica(s) = %d ranks need one GPU each, but "
                   "this host has %d (use --backend cpu, fewer ranks, or --gpus to place them)\n",
                   o->tp, o->workers, ranks, n_gpus);
      std::filesystem::remove(dir);
      return 2;
    }
    for (int r = 0; n_gpus > 0 && r < ranks; ++r) o->gpus.push_back(r);
  }
  const std::string exe = std::filesystem::read_symlink("/proc/self/exe").string();
  std::vector<Child> children;  // start order: scheduler, worker, gateway
  auto stop_all = [&]() {
    // Gateway first (no new requests), then the scheduler, which fails what is left and sends the
    // worker its Shutdown; the worker is signalled last only if it is still there.
    for (size_t i : {size_t{2}, size_t{0}, size_t{1}})
      if (i < children.size()) serve::Stop(&children[i], kStopGrace);
    for (size_t i = 3; i < children.size(); ++i) serve::Stop(&children[i], kStopGrace);  // more workers
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  };
  auto fail = [&](const std::string& why) {
    std::fprintf(stderr, "deltaserve serve: %s\n", why.c_str());
    stop_all();
    return 1;
  };
  auto dead_child = [&]() -> Child* {
    for (Child& c : children)
      if (serve::Reap(&c)) return &c;
    return nullptr;
  };

  // 0. With keys on the gateway, the scheduler's internal port (which can submit at any priority,
  // drain and register workers) must not stay open to every local process: a key for this run,
  // known to the three roles only.
  std::string internal_key_file;
  if (!o->api_key_file.empty() || !o->admin_key_file.empty()) {
    auto k = WriteInternalKey(dir);
    if (!k.ok()) return fail(std::string(k.status().message()));
    internal_key_file = *k;
  }

  // 1. scheduler (port from its port file)
  const std::string sched_port_file = dir + "/scheduler.port";
  // Metrics of each role on loopback: P, P+1, P+2 (or any free port with 0).
  auto metrics_listen = [&](int offset) {
    return absl::StrCat("127.0.0.1:", o->metrics_port == 0 ? 0 : o->metrics_port + offset);
  };
  std::vector<std::string> sargs = {"--listen",    "127.0.0.1:0", "--port-file",
                                    sched_port_file, "--slots",     std::to_string(o->slots),
                                    "--ctx",       std::to_string(o->ctx), "--split", o->split};
  if (o->metrics_port >= 0) {
    sargs.push_back("--metrics-listen");
    sargs.push_back(metrics_listen(0));
  }
  if (!internal_key_file.empty()) sargs.insert(sargs.end(), {"--internal-key-file", internal_key_file});
  if (!o->overcommit_headroom.empty())
    sargs.insert(sargs.end(), {"--overcommit-headroom", o->overcommit_headroom});
  if (!o->prefix_cache.empty()) sargs.insert(sargs.end(), {"--prefix-cache", o->prefix_cache});
  // Many short and a few long requests in one pool: --ctx is the pool, --slot-cap one request's
  // most (the worker sizes its per-slot tables and prefill scratch by it, not by the pool).
  if (o->slot_cap > 0)
    sargs.insert(sargs.end(), {"--slot-cap", std::to_string(o->slot_cap), "--slot-ctx",
                               std::to_string(o->slot_cap)});
  // Failover on: a lost replica's requests continue on the others, or wait for one.
  sargs.insert(sargs.end(), {"--failover-wait", absl::StrCat(o->failover_wait)});
  children.push_back(serve::Spawn("scheduler", exe, sargs));
  if (children.back().pid < 0) return fail("cannot start the scheduler");
  const std::string sched_ports =
      serve::WaitForFile(sched_port_file, &children.back(), kStartTimeout);
  const int sched_port = ReadPort(sched_ports, 0), sched_metrics_port = ReadPort(sched_ports, 1);
  if (sched_port == 0) {
    Child& c = children.back();
    return fail(c.exited ? "scheduler " + serve::DescribeExit(c) + " during startup"
                         : "scheduler did not report its port");
  }
  const std::string sched_addr = absl::StrCat("127.0.0.1:", sched_port);

  // 2. worker
  std::vector<std::string> wargs = {"--scheduler", sched_addr,  "--model",
                                    o->model,      "--backend", o->backend};
  if (o->threads > 0) {
    wargs.push_back("--threads");
    wargs.push_back(std::to_string(o->threads));
  }
  if (o->kv_type != "f16") wargs.insert(wargs.end(), {"--kv-type", o->kv_type});
  const std::vector<std::string> tuning = DeviceTuningArgs(o->tuning);
  wargs.insert(wargs.end(), tuning.begin(), tuning.end());
  if (o->mtp != "off") wargs.insert(wargs.end(), {"--mtp", o->mtp});
  if (o->max_active > 0) wargs.insert(wargs.end(), {"--max-active", std::to_string(o->max_active)});
  if (!o->prefix_cache.empty()) wargs.insert(wargs.end(), {"--prefix-cache", o->prefix_cache});
  if (!o->prefix_cache_mb.empty())
    wargs.insert(wargs.end(), {"--prefix-cache-mb", o->prefix_cache_mb});
  if (!o->prefix_cache_tier.empty())
    wargs.insert(wargs.end(), {"--prefix-cache-tier", o->prefix_cache_tier});
  if (!internal_key_file.empty())
    wargs.insert(wargs.end(), {"--scheduler-key-file", internal_key_file});
  // Replica 0's rank 0 here (index 1), every other rank after the gateway (indices 3..). A
  // replica is one worker ("serve-w<i>") or one TP group ("serve-g<i>" of ranks "serve-g<i>-r<r>").
  const std::string worker_port_file = dir + "/worker.port";
  auto rank_args = [&](int replica, int r) {
    std::vector<std::string> a = wargs;
    if (!o->gpus.empty())
      a.insert(a.end(), {"--device", std::to_string(o->gpus[replica * o->tp + r])});
    if (!o->kv_pool_tokens.empty()) a.insert(a.end(), {"--kv-pool-tokens", o->kv_pool_tokens});
    if (!o->max_step_tokens.empty()) a.insert(a.end(), {"--max-step-tokens", o->max_step_tokens});
    {
      // Worker processes sharing this rank's GPU each plan their share of it.
      const int gpu = o->gpus.empty() ? 0 : o->gpus[replica * o->tp + r];
      const int n_ranks = o->workers * o->tp;
      const int sharing = o->gpus.empty()
                              ? n_ranks
                              : static_cast<int>(std::count(o->gpus.begin(), o->gpus.end(), gpu));
      const double fraction = o->memory_fraction > 0 ? o->memory_fraction : 1.0 / std::max(1, sharing);
      if (fraction < 1.0) a.insert(a.end(), {"--memory-fraction", absl::StrCat(fraction)});
    }
    if (o->tp == 1) a.insert(a.end(), {"--worker-id", absl::StrCat("serve-w", replica)});
    // Every worker process (rank) exports its metrics: the k-th on P+2+k (any free port with
    // --metrics-port 0), reported through its port file (written before the model loads).
    const int k = replica * o->tp + r;
    a.insert(a.end(), {"--port-file", k == 0 ? worker_port_file : WorkerPortFile(dir, k)});
    if (o->metrics_port >= 0) a.insert(a.end(), {"--metrics-listen", metrics_listen(2 + k)});
    if (replica == 0 && r == 0 && !o->nvml_device.empty())
      a.insert(a.end(), {"--nvml-device", o->nvml_device});
    if (o->tp > 1) {
      a.insert(a.end(), {"--tp-rank", std::to_string(r), "--tp-world", std::to_string(o->tp),
                         "--tp-group", absl::StrCat("serve-g", replica), "--worker-id",
                         absl::StrCat("serve-g", replica, "-r", r)});
      if (!o->tp_split.empty()) a.insert(a.end(), {"--split", o->tp_split});
      if (!o->tp_collective.empty()) a.insert(a.end(), {"--tp-collective", o->tp_collective});
    }
    return a;
  };
  // Every worker process, for restarts: its arguments and its index in `children`.
  struct WorkerProc {
    std::vector<std::string> args;
    size_t child = 0;
    int restarts = 0;
    std::chrono::steady_clock::time_point restart_at{};  // pending restart (dead)
    bool dead = false;
  };
  std::vector<WorkerProc> workers;
  workers.push_back({rank_args(0, 0), children.size()});
  children.push_back(serve::Spawn("worker", exe, workers.back().args));
  if (children.back().pid < 0) return fail("cannot start the worker");
  const std::string worker_ports =
      serve::WaitForFile(worker_port_file, &children.back(), kStartTimeout);
  if (worker_ports.empty()) {
    Child& c = children.back();
    return fail(c.exited ? "worker " + serve::DescribeExit(c) + " during startup"
                         : "worker did not start");
  }
  const int worker_metrics_port = ReadPort(worker_ports, 0);

  // 3. gateway
  const std::string gw_port_file = dir + "/gateway.port";
  const int admin_port_req = o->port == 0 ? 0 : o->port + 1;
  std::vector<std::string> gargs = {
      "--listen", absl::StrCat("127.0.0.1:", o->port), "--admin-listen",
      absl::StrCat("127.0.0.1:", admin_port_req), "--scheduler", sched_addr, "--model", o->model,
      "--max-inflight", std::to_string(o->max_inflight), "--port-file", gw_port_file,
      // Below the launcher's stop grace, so a stop drains before anything is killed.
      "--drain-timeout", "5"};
  if (o->metrics_port >= 0) gargs.insert(gargs.end(), {"--metrics-listen", metrics_listen(1)});
  if (o->http_port >= 0)
    gargs.insert(gargs.end(), {"--http-listen", absl::StrCat("127.0.0.1:", o->http_port)});
  if (!internal_key_file.empty())
    gargs.insert(gargs.end(), {"--scheduler-key-file", internal_key_file});
  for (auto [flag, value] : {std::pair{"--api-key-file", &o->api_key_file},
                             {"--admin-key-file", &o->admin_key_file},
                             {"--tls-cert", &o->tls_cert},
                             {"--tls-key", &o->tls_key}})
    if (!value->empty()) gargs.insert(gargs.end(), {flag, *value});
  children.push_back(serve::Spawn("gateway", exe, gargs));
  if (children.back().pid < 0) return fail("cannot start the gateway");
  for (int i = 0; i < o->workers; ++i)
    for (int r = (i == 0 ? 1 : 0); r < o->tp; ++r) {
      workers.push_back({rank_args(i, r), children.size()});
      children.push_back(serve::Spawn("worker", exe, workers.back().args));
      if (children.back().pid < 0) return fail("cannot start a worker rank");
    }
  auto is_worker = [&](const Child* c) {
    for (const WorkerProc& w : workers)
      if (&children[w.child] == c) return true;
    return false;
  };
  const std::string ports =
      serve::WaitForFile(gw_port_file, &children[2], kStartTimeout);  // [2] = gateway
  const int gw_port = ReadPort(ports, 0), admin_port = ReadPort(ports, 1),
            gw_metrics_port = ReadPort(ports, 2), gw_http_port = ReadPort(ports, 3);
  if (gw_port == 0 || admin_port == 0) {
    if (Child* d = dead_child())
      return fail(d->role + " " + serve::DescribeExit(*d) + " during startup");
    return fail("gateway did not report its ports");
  }
  const std::string gw_addr = absl::StrCat("127.0.0.1:", gw_port);
  const std::string admin_addr = absl::StrCat("127.0.0.1:", admin_port);

  // 4. health SERVING = a worker finished warmup behind the scheduler behind the gateway.
  // Polled on the admin listener: it serves the same health and stays plaintext with TLS on.
  auto channel = gw::MakeChannel(admin_addr);
  bool interrupted = false;
  absl::Status ready = gw::WaitServing(channel.get(), kServingTimeout, [&] {
    timespec zero{0, 0};
    if (sigtimedwait(&sigs, nullptr, &zero) > 0) interrupted = true;
    return !interrupted && dead_child() == nullptr;
  });
  if (interrupted) return stop_all(), 130;
  if (Child* d = dead_child())
    return fail(d->role + " (pid " + std::to_string(d->pid) + ") " + serve::DescribeExit(*d) +
                " before the cluster served");
  if (!ready.ok()) return fail("gateway " + std::string(ready.message()));

  std::printf(
      "deltaserve serve: cluster SERVING\n"
      "  generation  %s   (deltaserve.v1.Generation, grpc.health.v1)\n"
      "  admin       %s   (deltaserve.v1.Admin)\n"
      "  scheduler   %s   (internal)\n"
      "  pids        scheduler %d, worker %d, gateway %d\n",
      gw_addr.c_str(), admin_addr.c_str(), sched_addr.c_str(), children[0].pid, children[1].pid,
      children[2].pid);
  if (gw_http_port > 0)
    std::printf("  http        127.0.0.1:%d   (OpenAI API: /v1/chat/completions, /v1/completions)\n",
                gw_http_port);
  if (!internal_key_file.empty())
    std::printf("  internal key %s   (mode 0600; the scheduler port takes only this key)\n",
                internal_key_file.c_str());
  if (o->metrics_port >= 0) {
    std::printf("  metrics     gateway 127.0.0.1:%d, scheduler 127.0.0.1:%d, worker 127.0.0.1:%d",
                gw_metrics_port, sched_metrics_port, worker_metrics_port);
    for (int k = 1; k < o->workers * o->tp; ++k)
      std::printf(", 127.0.0.1:%d", ReadPort(serve::WaitForFile(WorkerPortFile(dir, k),
                                                                &children[workers[k].child],
                                                                kStartTimeout),
                                             0));
    std::printf("\n");
  }
  std::fflush(stdout);

  if (o->demo) {
    const int rc = RunDemo(gw_addr, *o);
    if (Child* d = dead_child())
      return fail(d->role + " (pid " + std::to_string(d->pid) + ") " + serve::DescribeExit(*d));
    stop_all();
    for (const Child& c : children)
      if (!(WIFEXITED(c.wait_status) && WEXITSTATUS(c.wait_status) == 0))
        std::fprintf(stderr, "deltaserve serve: %s %s at shutdown\n", c.role.c_str(),
                     serve::DescribeExit(c).c_str());
    return rc;
  }

  std::printf("deltaserve serve: ^C or SIGTERM stops the cluster\n");
  std::fflush(stdout);
  // Supervision: a dead worker is restarted (backoff 1, 2, 4 ... 30 s) and rejoins as a new
  // replica; its requests meanwhile continue on the other replicas (or wait --failover-wait). A
  // dead scheduler or gateway stops the cluster.
  while (true) {
    timespec tick{0, 200'000'000};
    const int sig = sigtimedwait(&sigs, nullptr, &tick);
    if (sig > 0) {
      std::fprintf(stderr, "deltaserve serve: signal %d: stopping the cluster\n", sig);
      stop_all();
      return 0;
    }
    const auto now = std::chrono::steady_clock::now();
    for (WorkerProc& w : workers) {
      Child& c = children[w.child];
      if (!w.dead && serve::Reap(&c)) {
        w.dead = true;
        const int backoff = std::min(30, 1 << std::min(w.restarts, 5));
        w.restart_at = now + std::chrono::seconds(backoff);
        std::fprintf(stderr, "deltaserve serve: worker (pid %d) %s; restarting in %d s\n", c.pid,
                     serve::DescribeExit(c).c_str(), backoff);
      } else if (w.dead && now >= w.restart_at) {
        c = serve::Spawn("worker", exe, w.args);
        w.dead = c.pid < 0;
        ++w.restarts;
        if (w.dead) {
          w.restart_at = now + std::chrono::seconds(30);
        } else {
          std::fprintf(stderr, "deltaserve serve: worker restarted (pid %d, restart %d)\n", c.pid,
                       w.restarts);
        }
      }
    }
    for (Child& c : children)
      if (!is_worker(&c) && serve::Reap(&c))
        return fail(c.role + " (pid " + std::to_string(c.pid) + ") " + serve::DescribeExit(c) +
                    "; stopping the cluster");
  }
}

}  // namespace ds
