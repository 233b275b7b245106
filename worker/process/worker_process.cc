#include "worker/process/worker_process.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/auth/bearer.h"
#include "common/auth/tls.h"
#include "common/config/config_file.h"
#include "common/config/role.h"
#include "common/gguf/gguf.h"
#include "common/log/log.h"
#include "common/metrics/metrics_server.h"
#include "common/metrics/worker_metrics.h"
#include "common/systemd/notify.h"
#include "common/systemd/watchdog.h"
#include "deltaserve/internal/cluster.grpc.pb.h"
#include "worker/backend_factory.h"
#include "worker/model/config.h"
#include "worker/model/kv_type.h"
#include "worker/model/weights.h"
#include "worker/process/step_executor.h"
#include "worker/process/json_vocab.h"
#include "worker/process/step_proto.h"
#include "worker/process/tp_session.h"
#include "common/util/model_alias.h"

namespace ds {
namespace {

// Exit status of a TP rank that left a broken group mid-step (LeaveBrokenGroupIfStuck): not 0,
// so that systemd's Restart=on-failure and serve's supervisor start it again.
constexpr int kExitTpGroupBroken = 75;  // EX_TEMPFAIL

namespace pb = deltaserve::internal;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }


// What the scheduler needs to plan memory: CPU backend figures (f32 state); for the CUDA backend
// the KV bytes follow --kv-type (f16 / q8_0 / q4_0 rows) and the delta-rule state --gdn-state
// (f32 / bf16; the CPU backend keeps f32 storage either way), the rest is the same estimate.
struct MemoryFigures {
  uint64_t weights = 0;
  uint64_t kv_per_token = 0;
  uint64_t recurrent_per_slot = 0;
  uint64_t budget = 0;
};

MemoryFigures Figures(const ModelConfig& c, uint64_t file_bytes, bool cpu, GgmlType kv_type,
                      bool gdn_state_bf16) {
  MemoryFigures m;
  m.weights = file_bytes;
  m.kv_per_token = uint64_t{2} * c.n_attention() * c.n_head_kv *
                   (cpu ? uint64_t{4} * c.head_dim : KvRowBytes(kv_type, c.head_dim));
  const uint64_t state_elem = !cpu && gdn_state_bf16 ? 2 : 4;
  m.recurrent_per_slot =
      c.n_recurrent() * (uint64_t{4} * (c.conv_kernel - 1) * c.gdn_conv_channels() +
                         state_elem * c.gdn_v_heads * c.gdn_k_dim * c.gdn_v_dim);
  if (cpu) m.budget = uint64_t(sysconf(_SC_AVPHYS_PAGES)) * uint64_t(sysconf(_SC_PAGESIZE));
  return m;
}

// Greedy generation on the scratch slot: prefill `n_prompt` tokens, then decode `n_decode`.
// TP: every rank runs it in lock-step; rank 0's token is broadcast so all feed the same one.
absl::StatusOr<pb::WarmupDone> Warmup(Backend& be, int scratch, int n_decode,
                                      Collective* group = nullptr) {
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
    int32_t next = 0;
    if (out.logits.size() >= static_cast<size_t>(n_vocab))  // empty on TP ranks > 0 (rank0 head)
      next = static_cast<int32_t>(
          std::max_element(out.logits.begin(), out.logits.begin() + n_vocab) - out.logits.begin());
    if (group) DS_RETURN_IF_ERROR(group->Broadcast(&next, sizeof(next), 0));
    q.pos0 += static_cast<int32_t>(q.tokens.size());
    q.tokens = {next};
    DS_RETURN_IF_ERROR(be.Forward({&q, 1}, StepOptions{}, &out));
  }
  const auto t2 = Clock::now();
  be.ResetSlot(scratch);
  pb::WarmupDone w;
  w.set_prefill_tokens_per_second(n_prompt / std::max(1e-9, Seconds(t1 - t0)));
  w.set_decode_tokens_per_second(n_decode / std::max(1e-9, Seconds(t2 - t1)));
  return w;
}

// TLS to the scheduler: on when a CA is given.
auth::ClientTlsFiles SchedulerTls(const WorkerOptions& o) {
  auth::ClientTlsFiles tls;
  tls.tls = !o.scheduler_ca.empty();
  tls.ca_file = o.scheduler_ca;
  tls.server_name = o.scheduler_tls_name;
  return tls;
}

class Session {
 public:
  // `file` is the model, opened once (RunWorker); the backend is created over it at Configure.
  // `device` names the device the worker serves on ("cpu", "cuda:N").
  Session(const WorkerOptions& o, std::shared_ptr<const gguf::File> file, const ModelConfig& cfg,
          std::string device, metrics::WorkerMetrics* metrics, sd::Watchdog* watchdog)
      : o_(o), device_(std::move(device)), file_(std::move(file)), cfg_(cfg), metrics_(metrics) {
    if (watchdog && watchdog->enabled()) {
      // A forward pass must finish within half the watchdog interval (a hung GPU otherwise);
      // the heartbeat thread proves the process is not deadlocked on the stream lock.
      const auto half = std::chrono::duration_cast<std::chrono::nanoseconds>(watchdog->interval() / 2);
      step_loop_ = watchdog->RegisterBounded("worker_step", half);
      heartbeat_loop_ = watchdog->RegisterPeriodic(
          "heartbeat", std::max<std::chrono::nanoseconds>(std::chrono::seconds(5), half));
    }
  }

  // WorkerLeaveRequest: finish the step in progress, then end the session (see Serve).
  void Leave() {
    std::lock_guard<std::mutex> l(leave_mu_);
    if (leaving_) return;
    leaving_ = true;
    DS_LOG(INFO, "leaving", {{"reason", "asked to stop"}, {"step_in_progress", in_step_}});
    sd::NotifyStopping("leaving the cluster");
    // Idle in Read: wake it (before the call starts, Run checks leaving() once it has a stream).
    if (!in_step_) ctx_.TryCancel();
  }
  bool leaving() {
    std::lock_guard<std::mutex> l(leave_mu_);
    return leaving_;
  }

  absl::Status Run() {
    const uint64_t file_bytes = file_->size();
    const std::string fingerprint =
        absl::StrCat(std::filesystem::path(o_.model).filename().string(), ":",
                     file_->tensors().size(), ":", file_bytes);

    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(-1);
    args.SetMaxSendMessageSize(-1);
    std::string token;
    if (!o_.scheduler_key_file.empty()) {
      DS_ASSIGN_OR_RETURN(token, auth::ReadClientToken(o_.scheduler_key_file));
    }
    DS_ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel,
                        auth::MakeChannel(o_.scheduler, SchedulerTls(o_), token, args));
    DS_RETURN_IF_ERROR(Dial(*channel));
    channel_ = channel;
    auto stub = pb::Scheduler::NewStub(channel);
    stream_ = stub->WorkerSession(&ctx_);
    if (leaving()) {  // asked to stop while loading: never join
      ctx_.TryCancel();
      stream_->Finish().IgnoreError();
      return absl::OkStatus();
    }

    const ModelConfig& c = cfg_;
    mem_ = Figures(c, file_bytes, device_ == "cpu", o_.kv_type, o_.tuning.gdn_state_bf16);
    pb::WorkerMessage reg;
    pb::Register* r = reg.mutable_register_();
    r->set_worker_id(o_.worker_id);
    r->set_device(device_);
    r->set_model_fingerprint(fingerprint);
    r->set_n_vocab(static_cast<uint32_t>(c.n_vocab));
    r->set_n_ctx_train(static_cast<uint32_t>(c.n_ctx_train));
    r->set_state_budget_bytes(mem_.budget);
    r->set_kv_bytes_per_token(mem_.kv_per_token);
    r->set_recurrent_bytes_per_slot(mem_.recurrent_per_slot);
    r->set_weights_bytes(mem_.weights);
    if (o_.tp_world > 1) {
      r->set_tp_group(o_.tp_group);
      r->set_tp_rank(static_cast<uint32_t>(o_.tp_rank));
      r->set_tp_world(static_cast<uint32_t>(o_.tp_world));
    }
    if (!Write(reg)) return Broken("sending Register");
    DS_LOG(INFO, "registered",
           {{"scheduler", o_.scheduler}, {"device", device_}, {"model", fingerprint}});
    sd::NotifyStatus("registered with " + o_.scheduler + ", waiting for configuration");

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
      DrainUntilClosed(std::chrono::seconds(10));
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

  // Finish() does not return before every message the scheduler sent is read, and a step sent
  // ahead (the scheduler's lookahead) may still be unread: read until the scheduler ends the
  // stream, cancelling it after `limit`.
  void DrainUntilClosed(std::chrono::seconds limit) {
    std::mutex m;
    std::condition_variable cv;
    bool drained = false;
    std::thread guard([&] {
      std::unique_lock<std::mutex> l(m);
      if (!cv.wait_for(l, limit, [&] { return drained; })) ctx_.TryCancel();
    });
    pb::SchedulerMessage unread;
    while (stream_->Read(&unread)) {
    }
    {
      std::lock_guard<std::mutex> l(m);
      drained = true;
    }
    cv.notify_all();
    guard.join();
  }

  absl::Status Broken(const char* what) {
    {
      std::lock_guard<std::mutex> l(mu_);
      closed_ = true;
    }
    DrainUntilClosed(std::chrono::seconds(10));
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
      if (heartbeat_loop_) heartbeat_loop_->Beat();
      if (closed_) break;
      pb::WorkerMessage m;
      m.mutable_heartbeat()->set_unix_seconds(
          std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
              .count());
      // Under mu_: serialized with step results. A failed write means the scheduler closed
      // this session.
      if (!stream_->Write(m)) LeaveBrokenGroupIfStuck();
    }
  }

  // In a TP group the scheduler closes every rank's session as soon as one rank is lost. If this
  // rank is inside a step then, its collective may wait for the lost peer for a long time (NCCL,
  // the CUDA IPC all-reduce's barrier) and the step thread, which is the stream's reader, never
  // sees the close. Leave at once instead: the process exit frees the GPU and the collective's
  // resources, and the supervisor (serve, systemd) starts the rank again so the group re-forms.
  void LeaveBrokenGroupIfStuck() {
    if (o_.tp_world <= 1) return;
    bool stepping = false;
    {
      std::lock_guard<std::mutex> l(leave_mu_);
      stepping = in_step_;
    }
    if (!stepping) return;  // the step thread sees the closed stream itself
    DS_LOG(ERROR, "tp_group_broken",
           {{"tp_group", o_.tp_group},
            {"tp_rank", o_.tp_rank},
            {"action", "the session was closed during a step (a peer is lost): exiting now so "
                       "the collective does not hold the GPU"}});
    std::fflush(nullptr);
    std::_Exit(kExitTpGroupBroken);
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
          store_.reset();  // its device checkpoints live in the backend's device memory
          be_.reset();
          BackendOptions bo;
          bo.n_slots = static_cast<int>(cf.n_slots()) + 1;
          bo.slot_ctx = static_cast<int>(cf.slot_ctx());
          bo.n_threads = o_.threads;
          bo.device = o_.device;
          bo.kv_type = o_.kv_type;
          ApplyDeviceTuning(o_.tuning, &bo);
          bo.kv_pool_tokens = o_.kv_pool_tokens;
          bo.kv_page_size = o_.kv_page_size;
          bo.memory_fraction = o_.memory_fraction;
          bo.max_step_tokens = o_.max_step_tokens;
          // Device-memory checkpoints (under TP each rank's of its shard): the planner keeps
          // their budget free (all of it for --prefix-cache-tier device, at most a quarter of
          // what is left for auto).
          if (o_.prefix_cache_mb > 0 && o_.prefix_cache_tier != "host") {
            bo.prefix_cache_bytes = o_.prefix_cache_mb << 20;
            bo.prefix_cache_required = o_.prefix_cache_tier == "device";
          }
          if (o_.max_active > 0) bo.max_active_slots = o_.max_active + 1;  // + warmup scratch
          sd::NotifyStatus(absl::StrCat("loading ", o_.model, " for ", cf.n_slots(), " slots x ",
                                        cf.slot_ctx(), " positions"));
          const bool nccl = o_.tp_collective == "nccl";
          if (o_.tp_world > 1 || nccl) {
            // TP rank (docs/tp.md §6): meet the other ranks through the scheduler once, then
            // load only this rank's shard (CPU or CUDA backend).
            if (!tp_.collective) {
              const bool cuda_backend =
                  o_.backend == "cuda" || (o_.backend == "auto" && CudaAvailable());
              auto kind = worker::ResolveTpCollective(o_.tp_collective, cuda_backend);
              if (!kind.ok()) return Fatal(kind.status());
              worker::TpOptions t;
              t.rank = o_.tp_rank;
              t.world = o_.tp_world;
              t.group = o_.tp_group;
              t.split = o_.tp_split;
              t.iface = o_.tp_iface;
              t.addr = o_.tp_addr;
              if (t.addr.empty() && t.iface.empty()) {
                auto a = worker::LocalAddressToward(o_.scheduler);
                if (!a.ok()) return Fatal(a.status());
                t.addr = *a;
              }
              // A TP = 1 worker registers without a group, so the scheduler sends no prefix;
              // NCCL's bootstrap still goes through the scheduler's store under a private one.
              std::string prefix = cf.tp_prefix();
              if (prefix.empty() && o_.tp_world == 1)
                prefix = absl::StrCat("tp/solo/", o_.worker_id, "/", getpid(), "/");
              auto g = worker::JoinTpGroup(t, *kind, o_.device, prefix, channel_);
              if (!g.ok()) return Fatal(g.status());
              tp_ = std::move(*g);
              DS_LOG(INFO, "tp_joined",
                     {{"collective", tp_.collective->name()}, {"rank", o_.tp_rank},
                      {"world", o_.tp_world},
                      {"addr", t.iface.empty() ? t.addr : "iface " + t.iface}});
            }
            bo.tp_rank = o_.tp_rank;
            bo.tp_world = o_.tp_world;
            bo.tp_split = tp_.split;
            bo.collective = tp_.collective.get();
          }
          // MTP: room for one verify step of K + 1 tokens for up to mtp_seqs slots at once.
          SpeculativeRoom room;
          if (o_.mtp.drafts > 0) {
            room.tokens = o_.mtp.drafts + 1;
            room.seqs = std::min<int>(o_.mtp_seqs, static_cast<int>(cf.n_slots()));
          }
          auto be = CreateBackend(o_.backend, file_, bo, room);
          if (!be.ok()) return Fatal(be.status());
          be_ = std::move(*be);
          n_usable = static_cast<int>(cf.n_slots());
          executor_ = std::make_unique<worker::StepExecutor>(be_.get(), n_usable);
          // Token broadcasts only where there is a peer to receive them.
          if (tp_.collective && tp_.collective->world() > 1)
            executor_->SetGroup(tp_.collective.get());
          if (absl::Status ms = executor_->SetMtp(o_.mtp); !ms.ok()) return Fatal(ms);
          executor_->SetDeferredDrafts(o_.tuning.deferred_drafts);
          executor_->SetJsonVocabLoader([file = file_] { return worker::JsonVocabFromGguf(*file); });
          // Prefix cache (issue #17): checkpoints of slot state at exact positions; under TP
          // each rank keeps its shard's and the executor keeps the ranks in agreement.
          if (o_.prefix_cache_mb > 0) {
            CheckpointStoreOptions co;
            co.budget_bytes = o_.prefix_cache_mb << 20;
            co.prefer_device = o_.prefix_cache_tier != "host";
            store_ = std::make_unique<CheckpointStore>(be_.get(), co);
            if (o_.prefix_cache_tier == "device" && !store_->on_device())
              return Fatal(absl::InvalidArgumentError(
                  "--prefix-cache-tier device: backend " + be_->name() +
                  " keeps no checkpoints in device memory (use auto or host)"));
            executor_->SetCheckpointStore(store_.get());
            DS_LOG(INFO, "prefix_cache", {{"enabled", true}, {"budget_mib", o_.prefix_cache_mb},
                                          {"tier", store_->tier()}});
          }
          DS_LOG(INFO, "configured", {{"slots", n_usable}, {"slot_ctx", cf.slot_ctx()},
                                      {"device", be_->name()}});
          {
            // The memory plan: what the device holds and the KV pool the slots share.
            const MemoryFootprint mf = be_->memory();
            const KvPoolStats kp = be_->kv_pool();
            const double gib = 1.0 / (1ull << 30);
            DS_LOG(INFO, "memory_plan",
                   {{"weights_gib", mf.weights * gib}, {"kv_pool_gib", mf.kv_cache * gib},
                    {"kv_pool_tokens", kp.total_tokens()}, {"kv_page", kp.page_size},
                    {"recurrent_gib", mf.recurrent * gib}, {"workspace_gib", mf.workspace * gib},
                    {"total_gib", mf.total() * gib},
                    {"prefix_cache_reserved_gib", mf.cache_reserved * gib}, {"slots", n_usable},
                    {"slot_ctx", cf.slot_ctx()}, {"memory_fraction", o_.memory_fraction},
                    {"dense_copies_gib", mf.dense_copies * gib},
                    {"dense_weights", mf.dense_choice}});
          }
          sd::NotifyStatus("warming up");
          break;
        }
        case pb::SchedulerMessage::kWarmup: {
          if (!executor_) return Fatal(absl::FailedPreconditionError("Warmup before Configure"));
          auto w = Warmup(*be_, n_usable, static_cast<int>(msg.warmup().tokens()),
                          tp_.collective && tp_.collective->world() > 1 ? tp_.collective.get()
                                                                        : nullptr);
          if (!w.ok()) return Fatal(w.status());
          // What the backend holds (its own report); weights: the file, mapped or uploaded.
          const MemoryFootprint held = be_->memory();
          w->set_weights_bytes(std::max(mem_.weights, held.weights));
          w->set_kv_bytes(held.kv_cache);
          w->set_state_bytes(held.recurrent);
          w->set_workspace_bytes(held.workspace);
          // The KV pool the scheduler admits against (0 tokens: no paged pool).
          w->set_kv_pool_tokens(static_cast<uint64_t>(be_->kv_pool().total_tokens()));
          w->set_kv_page_size(static_cast<uint32_t>(be_->kv_pool().page_size));
          w->set_mtp_drafts(static_cast<uint32_t>(o_.mtp.drafts));
          w->set_follows_work(true);
          if (o_.max_active > 0)
            w->set_active_slots(static_cast<uint32_t>(std::min(o_.max_active, n_usable)));
          w->set_mtp_auto(o_.mtp.automatic);
          if (store_) {
            w->set_prefix_cache_bytes(store_->stats().budget_bytes);
            w->set_prefix_cache_tier(store_->tier());
          }
          DS_LOG(INFO, "warmup_done",
                 {{"prefill_tokens_per_s", w->prefill_tokens_per_second()},
                  {"decode_tokens_per_s", w->decode_tokens_per_second()},
                  {"weights_bytes", w->weights_bytes()},
                  {"kv_bytes", w->kv_bytes()},
                  {"state_bytes", w->state_bytes()},
                  {"workspace_bytes", w->workspace_bytes()}});
          if (metrics_) {
            metrics_->SetMemory(metrics::MemoryKind::kWeights, w->weights_bytes());
            metrics_->SetMemory(metrics::MemoryKind::kKv, w->kv_bytes());
            metrics_->SetMemory(metrics::MemoryKind::kRecurrentState, w->state_bytes());
            metrics_->SetMemory(metrics::MemoryKind::kWorkspace, w->workspace_bytes());
            metrics_->SetWarmup(w->prefill_tokens_per_second(), w->decode_tokens_per_second());
          }
          const std::string ready =
              absl::StrCat("serving ", n_usable, " slots on ", be_->name(), "; warmup decode ",
                           static_cast<int>(w->decode_tokens_per_second()), " tok/s");
          pb::WorkerMessage m;
          *m.mutable_warmup_done() = std::move(*w);
          if (!Write(m)) return absl::UnavailableError("write");
          if (metrics_) metrics_->SetReady(true);
          // systemd: READY only now, after the model is loaded and a real generation ran.
          sd::NotifyReady(ready);
          break;
        }
        case pb::SchedulerMessage::kStep: {
          if (!executor_) return Fatal(absl::FailedPreconditionError("Step before Configure"));
          {
            std::lock_guard<std::mutex> l(leave_mu_);
            if (leaving_) return absl::OkStatus();
            in_step_ = true;
          }
          const auto t_recv = std::chrono::steady_clock::now();
          // Protobuf stays here, at the stream: the executor sees only worker/process/step_types.h.
          worker::StepResult r;
          {
            sd::Watchdog::Loop::Work work(step_loop_.get());
            worker::FromProto(msg.step(), &step_);
            r = executor_->Run(step_);
          }
          if (metrics_) {
            int tokens = 0;
            for (const worker::SlotWork& w : step_.work) tokens += static_cast<int>(w.n_tokens);
            metrics_->OnStep(r.forward_seconds, r.sample_seconds, tokens, !r.error.empty());
            // MTP acceptance of this step's verifies.
            if (!executor_->last_verify_tokens().empty()) {
              const spec::SpecStats& ms = executor_->last_mtp_stats();
              metrics_->OnMtp(ms.offered, ms.accepted, executor_->last_verify_tokens());
            }
          }
          if (!r.error.empty())
            DS_LOG(ERROR, "step_failed", {{"step", step_.step_id}, {"error", r.error}});
          pb::WorkerMessage m;
          worker::ToProto(r, m.mutable_step_result());
          m.mutable_step_result()->set_handle_seconds(
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t_recv).count());
          if (!Write(m)) return absl::UnavailableError("write");
          // TP: a failed collective leaves the group unusable; leave it (the scheduler drops
          // the whole group and fails or replays its requests).
          if (executor_->group_broken())
            return Fatal(absl::UnavailableError("tp group broken: " + r.error));
          {
            std::lock_guard<std::mutex> l(leave_mu_);
            in_step_ = false;
            // Asked to leave during the step: it is answered; the scheduler replays the rest.
            if (leaving_) return absl::OkStatus();
          }
          break;
        }
        case pb::SchedulerMessage::kShutdown:
          DS_LOG(INFO, "shutdown_requested");
          sd::NotifyStopping("shutdown requested by the scheduler");
          return absl::OkStatus();
        default:
          return Fatal(absl::InvalidArgumentError("unknown scheduler message"));
      }
    }
    if (leaving()) return absl::OkStatus();  // our own cancel ended the stream
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
  worker::TpGroup tp_;  // TP collective; declared before be_, whose backend points into it
  std::string device_;
  std::shared_ptr<const gguf::File> file_;  // the model, opened once; the backend's weights view it
  ModelConfig cfg_;
  std::unique_ptr<Backend> be_;
  metrics::WorkerMetrics* metrics_ = nullptr;
  std::shared_ptr<sd::Watchdog::Loop> step_loop_, heartbeat_loop_;
  std::unique_ptr<CheckpointStore> store_;  // prefix cache; destroyed before be_
  std::unique_ptr<worker::StepExecutor> executor_;
  worker::Step step_;  // the Step being run, converted from the stream's message (reused)
  std::shared_ptr<grpc::Channel> channel_;  // to the scheduler (also the TP rendezvous)
  MemoryFigures mem_;
  grpc::ClientContext ctx_;  // outlives stream_ (declared first)
  std::unique_ptr<grpc::ClientReaderWriter<pb::WorkerMessage, pb::SchedulerMessage>> stream_;
  std::mutex mu_;  // serializes stream writes (steps, heartbeats) and guards closed_
  std::mutex leave_mu_;  // guards leaving_ and in_step_ (Leave comes from the signal thread)
  bool leaving_ = false;
  bool in_step_ = false;
  std::condition_variable hb_cv_;
  bool closed_ = false;
};

}  // namespace

void WorkerLeaveRequest::Request() {
  std::lock_guard<std::mutex> l(mu_);
  requested_ = true;
  if (on_request_) on_request_();
}

bool WorkerLeaveRequest::requested() const {
  std::lock_guard<std::mutex> l(mu_);
  return requested_;
}

void WorkerLeaveRequest::Attach(std::function<void()> on_request) {
  std::lock_guard<std::mutex> l(mu_);
  on_request_ = std::move(on_request);
  if (requested_ && on_request_) on_request_();
}

absl::Status RunWorker(const WorkerOptions& o) { return RunWorker(o, nullptr, nullptr); }

absl::Status RunWorker(const WorkerOptions& o, metrics::WorkerMetrics* metrics,
                       sd::Watchdog* watchdog, WorkerLeaveRequest* leave) {
  // Credentials first: a bad key or CA file is reported before a long model load.
  if (!o.scheduler_key_file.empty())
    DS_RETURN_IF_ERROR(auth::ReadClientToken(o.scheduler_key_file).status());
  if (!o.scheduler_ca.empty())
    DS_RETURN_IF_ERROR(auth::MakeChannelCredentials(SchedulerTls(o)).status());
  // The model is opened once and checked (configuration, every tensor's shape and type: weights
  // bound as views into the mapping, nothing copied to a device); Configure creates the backend
  // over the same file with the scheduler's slot shape, so the weights are uploaded once.
  BackendOptions bo;
  bo.device = o.device;
  DS_ASSIGN_OR_RETURN(const std::string device, BackendDeviceName(o.backend, bo));
  sd::NotifyStatus("opening " + o.model);
  DS_ASSIGN_OR_RETURN(std::unique_ptr<gguf::File> opened, gguf::File::Open(o.model));
  std::shared_ptr<const gguf::File> file(std::move(opened));
  DS_ASSIGN_OR_RETURN(const ModelConfig cfg, ModelConfig::FromGguf(*file));
  DS_RETURN_IF_ERROR(ModelWeights::Load(*file, cfg).status());
  if (metrics) {
    // GPU metrics where NVML is: the CUDA device by default, an explicit index on request.
    int gpu = o.nvml_device;
    if (gpu == -1) gpu = device.rfind("cuda", 0) == 0 ? o.device : -2;
    if (gpu >= 0) {
      absl::Status s = metrics->StartGpuSampling({gpu}, std::chrono::seconds(1));
      if (s.ok()) {
        DS_LOG(INFO, "gpu_metrics", {{"nvml_device", gpu}});
      } else {
        DS_LOG(WARNING, "gpu_metrics_unavailable", {{"nvml_device", gpu}, {"reason", s}});
      }
    }
  }
  Session s(o, std::move(file), cfg, device, metrics, watchdog);
  if (leave) leave->Attach([&s] { s.Leave(); });
  absl::Status st = s.Run();
  if (leave) leave->Attach(nullptr);
  return st;
}

int RunWorkerProcess(int argc, char** argv) {
  // SIGTERM / SIGINT: leave gracefully (finish the step in progress, hand the requests back).
  // Blocked here, before any thread exists, so every thread inherits the mask and only the
  // signal thread below takes them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  auto role = config::SetUpRole("worker", argc, argv);
  absl::StatusOr<WorkerOptions> o = role.ok() ? ParseWorkerFlags(role->args.argc(), role->args.argv())
                                              : absl::StatusOr<WorkerOptions>(role.status());
  if (role.ok() && !o.ok()) o = role->args.Explain(o.status());
  if (!o.ok()) {
    std::fprintf(
        stderr,
        "deltaserve worker: %s\nusage: deltaserve worker --scheduler HOST:PORT --model FILE "
        "[--backend cpu|cuda|auto] [--worker-id ID] [--threads N] [--device N] "
        "[--connect-timeout S] [--metrics-listen HOST:PORT] [--nvml-device N|off] "
        "[--port-file F] [--kv-type f16|q8_0|q4_0] [--portable on|off] [--dense-weights "
        "on|off|auto] [--early-launch on|off] [--tiled-f16-formats on|off] [--f16-wgmma on|off] "
        "[--prefill-fp8 on|off] [--fp8-decode-rows N] [--coarse-draft-head on|off] "
        "[--deferred-drafts on|off] [--judged-chains on|off] [--draft-resident on|off] "
        "[--chain-fold on|off] [--chain-prefetch on|off] [--gdn-one-group on|off] "
        "[--gdn-state f32|bf16] "
        "[--kv-pool-tokens N] [--kv-page N] "
        "[--memory-fraction F] [--max-step-tokens N] "
        "[--prefix-cache on|off] [--prefix-cache-mb N] [--prefix-cache-tier auto|host|device] "
        "[--log-level L] [--config FILE] [--tp-rank R --tp-world W "
        "[--tp-group NAME] [--split 1,2|mem] [--tp-iface IF | --tp-addr ADDR] "
        "[--tp-collective auto|gloo|nccl|custom]] [--scheduler-key-file F] [--scheduler-ca F "
        "[--scheduler-tls-name N]]\n",
        std::string(o.status().message()).c_str());
    return 2;
  }
  log::Init("worker", {{"worker", o->worker_id}});
  auto fail = [&](const absl::Status& s) {
    DS_LOG(ERROR, "exiting", {{"error", s}});
    return 1;
  };
  // /metrics first, so a long model load is visible (deltaserve_worker_ready 0).
  auto metrics_server = metrics::MetricsServer::Start(role->metrics_listen, "worker");
  if (!metrics_server.ok()) return fail(metrics_server.status());
  metrics::WorkerMetrics worker_metrics((*metrics_server)->registry(), o->worker_id);
  if (!o->port_file.empty()) {
    const std::string tmp = o->port_file + ".tmp";
    std::ofstream(tmp) << (*metrics_server)->port() << "\n";
    std::rename(tmp.c_str(), o->port_file.c_str());
  }
  std::unique_ptr<sd::Watchdog> watchdog = sd::Watchdog::FromEnvironment();
  watchdog->SetStallCallback([](const std::string& name, double overdue_s) {
    DS_LOG(ERROR, "watchdog_stall", {{"loop", name}, {"overdue_s", overdue_s}});
  });
  watchdog->Start();
  WorkerLeaveRequest leave;
  std::atomic<bool> done{false};
  std::thread signals([&] {
    while (!done.load()) {
      timespec tick{0, 100'000'000};
      const int sig = sigtimedwait(&stop_signals, nullptr, &tick);
      if (sig > 0) {
        DS_LOG(INFO, "signal", {{"signal", sig}, {"action", "leave after the step in progress"}});
        leave.Request();
      }
    }
  });
  absl::Status s = RunWorker(*o, &worker_metrics, watchdog.get(), &leave);
  done = true;
  signals.join();
  watchdog->Stop();
  if (!s.ok()) return fail(s);
  DS_LOG(INFO, "exiting", {{"reason", "shutdown"}});
  return 0;
}

}  // namespace ds
