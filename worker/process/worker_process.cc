#include "worker/process/worker_process.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/gguf/gguf.h"
#include "deltaserve/internal/cluster.grpc.pb.h"
#include "worker/backend_factory.h"
#include "worker/process/step_executor.h"

namespace ds {
namespace {

namespace pb = deltaserve::internal;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

void Log(const std::string& id, const std::string& msg) {
  std::fprintf(stderr, "[worker %s] %s\n", id.c_str(), msg.c_str());
  std::fflush(stderr);
}

// What the scheduler needs to plan memory: CPU backend figures (f32 state). The CUDA backend
// reports its own figures in WarmupDone once it has allocated.
struct MemoryFigures {
  uint64_t weights = 0;
  uint64_t kv_per_token = 0;
  uint64_t recurrent_per_slot = 0;
  uint64_t budget = 0;
};

MemoryFigures Figures(const ModelConfig& c, uint64_t file_bytes, bool cpu) {
  MemoryFigures m;
  m.weights = file_bytes;
  m.kv_per_token = uint64_t{4} * 2 * c.n_attention() * c.n_head_kv * c.head_dim;
  m.recurrent_per_slot =
      uint64_t{4} * c.n_recurrent() *
      (uint64_t(c.conv_kernel - 1) * c.gdn_conv_channels() +
       uint64_t(c.gdn_v_heads) * c.gdn_k_dim * c.gdn_v_dim);
  if (cpu) m.budget = uint64_t(sysconf(_SC_AVPHYS_PAGES)) * uint64_t(sysconf(_SC_PAGESIZE));
  return m;
}

// Greedy generation on the scratch slot: prefill `n_prompt` tokens, then decode `n_decode`.
absl::StatusOr<pb::WarmupDone> Warmup(Backend& be, int scratch, int n_decode) {
  const int n_vocab = be.config().n_vocab;
  n_decode = std::max(1, n_decode);
  const int n_prompt = std::max(1, std::min(64, be.slot_ctx() - n_decode - 1));
  if (n_prompt + n_decode > be.slot_ctx())
    return absl::InvalidArgumentError(absl::StrCat("slot_ctx ", be.slot_ctx(),
                                                   " too small for a warmup of ", n_decode));
  be.ResetSlot(scratch);
  SeqStep q;
  q.slot = scratch;
  q.pos0 = 0;
  for (int i = 0; i < n_prompt; ++i) q.tokens.push_back((i * 7919 + 1) % n_vocab);
  StepOutput out;
  const auto t0 = Clock::now();
  DS_RETURN_IF_ERROR(be.Forward({&q, 1}, StepOptions{}, &out));
  const auto t1 = Clock::now();
  for (int i = 0; i < n_decode; ++i) {
    const auto it = std::max_element(out.logits.begin(), out.logits.begin() + n_vocab);
    q.pos0 += static_cast<int32_t>(q.tokens.size());
    q.tokens = {static_cast<int32_t>(it - out.logits.begin())};
    DS_RETURN_IF_ERROR(be.Forward({&q, 1}, StepOptions{}, &out));
  }
  const auto t2 = Clock::now();
  be.ResetSlot(scratch);
  pb::WarmupDone w;
  w.set_prefill_tokens_per_second(n_prompt / std::max(1e-9, Seconds(t1 - t0)));
  w.set_decode_tokens_per_second(n_decode / std::max(1e-9, Seconds(t2 - t1)));
  return w;
}

// "--flag value" pairs; unknown flags are errors so a typo never falls back to a default.
absl::StatusOr<std::map<std::string, std::string>> ParsePairs(int argc, char** argv,
                                                             const std::set<std::string>& known) {
  std::map<std::string, std::string> m;
  for (int i = 0; i < argc; ++i) {
    const std::string f = argv[i];
    if (!known.count(f)) return absl::InvalidArgumentError("unknown flag '" + f + "'");
    if (i + 1 >= argc) return absl::InvalidArgumentError("flag " + f + " needs a value");
    m[f] = argv[++i];
  }
  return m;
}

class Session {
 public:
  Session(const WorkerOptions& o, std::unique_ptr<Backend> be) : o_(o), be_(std::move(be)) {}

  absl::Status Run() {
    auto file = gguf::File::Open(o_.model);
    if (!file.ok()) return file.status();
    const uint64_t file_bytes = (*file)->size();
    const std::string fingerprint =
        absl::StrCat(std::filesystem::path(o_.model).filename().string(), ":",
                     (*file)->tensors().size(), ":", file_bytes);
    file->reset();

    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(-1);
    args.SetMaxSendMessageSize(-1);
    auto channel =
        grpc::CreateCustomChannel(o_.scheduler, grpc::InsecureChannelCredentials(), args);
    DS_RETURN_IF_ERROR(Dial(*channel));
    auto stub = pb::Scheduler::NewStub(channel);
    stream_ = stub->WorkerSession(&ctx_);

    const ModelConfig& c = be_->config();
    mem_ = Figures(c, file_bytes, be_->name() == "cpu");
    pb::WorkerMessage reg;
    pb::Register* r = reg.mutable_register_();
    r->set_worker_id(o_.worker_id);
    r->set_device(be_->name());
    r->set_model_fingerprint(fingerprint);
    r->set_n_vocab(static_cast<uint32_t>(c.n_vocab));
    r->set_n_ctx_train(static_cast<uint32_t>(c.n_ctx_train));
    r->set_state_budget_bytes(mem_.budget);
    r->set_kv_bytes_per_token(mem_.kv_per_token);
    r->set_recurrent_bytes_per_slot(mem_.recurrent_per_slot);
    r->set_weights_bytes(mem_.weights);
    if (!Write(reg)) return Broken("sending Register");
    Log(o_.worker_id, absl::StrCat("registered with ", o_.scheduler, " (", be_->name(), ", ",
                                   fingerprint, ")"));

    std::thread heartbeat([this] { HeartbeatLoop(); });
    absl::Status result = Serve();
    {
      std::lock_guard<std::mutex> l(mu_);
      closed_ = true;
    }
    hb_cv_.notify_all();
    heartbeat.join();
    if (result.ok()) {
      stream_->WritesDone();
      pb::SchedulerMessage drain;
      while (stream_->Read(&drain)) {
      }
      stream_->Finish().IgnoreError();
      return result;
    }
    if (absl::IsUnavailable(result)) return Broken("reading");
    ctx_.TryCancel();
    stream_->Finish().IgnoreError();
    return result;
  }

 private:
  absl::Status Dial(grpc::Channel& channel) {
    const auto give_up = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                            std::chrono::duration<double>(o_.connect_timeout_s));
    auto backoff = std::chrono::milliseconds(50);
    int attempts = 0;
    while (true) {
      ++attempts;
      const auto until = std::min(give_up, Clock::now() + backoff);
      if (channel.WaitForConnected(std::chrono::system_clock::now() + (until - Clock::now())))
        return absl::OkStatus();
      if (Clock::now() >= give_up)
        return absl::UnavailableError(absl::StrCat("scheduler ", o_.scheduler,
                                                   " not reachable after ", attempts,
                                                   " attempts in ", o_.connect_timeout_s, " s"));
      backoff = std::min(backoff * 2, std::chrono::milliseconds(2000));
    }
  }

  absl::Status Broken(const char* what) {
    {
      std::lock_guard<std::mutex> l(mu_);
      closed_ = true;
    }
    grpc::Status s = stream_->Finish();
    return absl::UnavailableError(absl::StrCat("scheduler stream broke while ", what, ": ",
                                               s.ok() ? "closed by the scheduler" : s.error_message(),
                                               " (grpc code ", static_cast<int>(s.error_code()), ")"));
  }

  bool Write(const pb::WorkerMessage& m) {
    std::lock_guard<std::mutex> l(mu_);
    if (closed_) return false;
    return stream_->Write(m);
  }

  void HeartbeatLoop() {
    std::unique_lock<std::mutex> l(mu_);
    while (!closed_) {
      hb_cv_.wait_for(l, std::chrono::duration<double>(o_.heartbeat_s));
      if (closed_) break;
      pb::WorkerMessage m;
      m.mutable_heartbeat()->set_unix_seconds(
          std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
              .count());
      stream_->Write(m);  // under mu_: serialized with step results
    }
  }

  // OK on Shutdown; Unavailable when the stream ends without one; other errors are fatal.
  absl::Status Serve() {
    pb::SchedulerMessage msg;
    int n_usable = 0;
    while (stream_->Read(&msg)) {
      switch (msg.msg_case()) {
        case pb::SchedulerMessage::kConfigure: {
          const auto& cf = msg.configure();
          if (cf.n_slots() == 0 || cf.slot_ctx() == 0)
            return Fatal(absl::InvalidArgumentError("Configure with n_slots or slot_ctx 0"));
          // Recreate the backend with the scheduler's shape; one extra slot is the warmup scratch.
          executor_.reset();
          be_.reset();
          BackendOptions bo;
          bo.n_slots = static_cast<int>(cf.n_slots()) + 1;
          bo.slot_ctx = static_cast<int>(cf.slot_ctx());
          bo.n_threads = o_.threads;
          bo.device = o_.device;
          auto be = CreateBackend(o_.backend, o_.model, bo);
          if (!be.ok()) return Fatal(be.status());
          be_ = std::move(*be);
          n_usable = static_cast<int>(cf.n_slots());
          executor_ = std::make_unique<worker::StepExecutor>(be_.get(), n_usable);
          Log(o_.worker_id, absl::StrCat("configured: ", n_usable, " slots x ", cf.slot_ctx(),
                                         " positions"));
          break;
        }
        case pb::SchedulerMessage::kWarmup: {
          if (!executor_) return Fatal(absl::FailedPreconditionError("Warmup before Configure"));
          auto w = Warmup(*be_, n_usable, static_cast<int>(msg.warmup().tokens()));
          if (!w.ok()) return Fatal(w.status());
          w->set_weights_bytes(mem_.weights);
          w->set_kv_bytes(mem_.kv_per_token * uint64_t(n_usable + 1) * be_->slot_ctx());
          w->set_state_bytes(mem_.recurrent_per_slot * uint64_t(n_usable + 1));
          Log(o_.worker_id,
              absl::StrCat("warmup: prefill ", static_cast<int>(w->prefill_tokens_per_second()),
                           " tok/s, decode ", static_cast<int>(w->decode_tokens_per_second()),
                           " tok/s"));
          pb::WorkerMessage m;
          *m.mutable_warmup_done() = std::move(*w);
          if (!Write(m)) return absl::UnavailableError("write");
          break;
        }
        case pb::SchedulerMessage::kStep: {
          if (!executor_) return Fatal(absl::FailedPreconditionError("Step before Configure"));
          pb::WorkerMessage m;
          *m.mutable_step_result() = executor_->Run(msg.step());
          if (!m.step_result().error().empty())
            Log(o_.worker_id, absl::StrCat("step ", msg.step().step_id(),
                                           " failed: ", m.step_result().error()));
          if (!Write(m)) return absl::UnavailableError("write");
          break;
        }
        case pb::SchedulerMessage::kShutdown:
          Log(o_.worker_id, "shutdown requested by the scheduler");
          return absl::OkStatus();
        default:
          return Fatal(absl::InvalidArgumentError("unknown scheduler message"));
      }
    }
    return absl::UnavailableError("stream ended");
  }

  // Tells the scheduler before giving up, so it fails this worker's requests at once.
  absl::Status Fatal(absl::Status s) {
    pb::WorkerMessage m;
    m.set_fatal_error(s.ToString());
    Write(m);
    return s;
  }

  const WorkerOptions& o_;
  std::unique_ptr<Backend> be_;
  std::unique_ptr<worker::StepExecutor> executor_;
  MemoryFigures mem_;
  grpc::ClientContext ctx_;  // outlives stream_ (declared first)
  std::unique_ptr<grpc::ClientReaderWriter<pb::WorkerMessage, pb::SchedulerMessage>> stream_;
  std::mutex mu_;  // serializes stream writes (steps, heartbeats) and guards closed_
  std::condition_variable hb_cv_;
  bool closed_ = false;
};

}  // namespace

absl::StatusOr<WorkerOptions> ParseWorkerFlags(int argc, char** argv) {
  DS_ASSIGN_OR_RETURN(auto m, ParsePairs(argc, argv,
                                         {"--scheduler", "--model", "--backend", "--worker-id",
                                          "--threads", "--device", "--connect-timeout"}));
  WorkerOptions o;
  if (!m.count("--scheduler")) return absl::InvalidArgumentError("--scheduler HOST:PORT is required");
  if (!m.count("--model")) return absl::InvalidArgumentError("--model FILE is required");
  o.scheduler = m["--scheduler"];
  o.model = m["--model"];
  if (m.count("--backend")) o.backend = m["--backend"];
  if (m.count("--worker-id")) {
    o.worker_id = m["--worker-id"];
  } else {
    char host[256] = {0};
    gethostname(host, sizeof(host) - 1);
    o.worker_id = absl::StrCat(host, ":", getpid());
  }
  auto num = [&](const char* f, double* v) -> absl::Status {
    if (m.count(f) && !absl::SimpleAtod(m[f], v))
      return absl::InvalidArgumentError(absl::StrCat(f, " expects a number, got '", m[f], "'"));
    return absl::OkStatus();
  };
  double threads = 0, device = 0;
  DS_RETURN_IF_ERROR(num("--threads", &threads));
  DS_RETURN_IF_ERROR(num("--device", &device));
  DS_RETURN_IF_ERROR(num("--connect-timeout", &o.connect_timeout_s));
  o.threads = static_cast<int>(threads);
  o.device = static_cast<int>(device);
  return o;
}

absl::Status RunWorker(const WorkerOptions& o) {
  // A small backend first: validates the model file and gives the figures for Register; Configure
  // recreates it with the scheduler's slot shape.
  BackendOptions bo;
  bo.n_slots = 1;
  bo.slot_ctx = 16;
  bo.n_threads = o.threads;
  bo.device = o.device;
  DS_ASSIGN_OR_RETURN(auto be, CreateBackend(o.backend, o.model, bo));
  Session s(o, std::move(be));
  return s.Run();
}

int RunWorkerProcess(int argc, char** argv) {
  auto o = ParseWorkerFlags(argc, argv);
  if (!o.ok()) {
    std::fprintf(stderr,
                 "deltaserve worker: %s\nusage: deltaserve worker --scheduler HOST:PORT --model FILE "
                 "[--backend cpu|cuda|auto] [--worker-id ID] [--threads N] [--device N] "
                 "[--connect-timeout S]\n",
                 std::string(o.status().message()).c_str());
    return 2;
  }
  absl::Status s = RunWorker(*o);
  if (!s.ok()) {
    Log(o->worker_id, "exiting: " + s.ToString());
    return 1;
  }
  Log(o->worker_id, "exiting after shutdown");
  return 0;
}

}  // namespace ds
