#include "scheduler/daemon/cluster_service.h"

#include <algorithm>
#include <chrono>
#include <future>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "proto/convert/sampling_proto.h"

namespace ds::sched {
namespace {

namespace pb = deltaserve::internal;
namespace v1 = deltaserve::v1;

// Cancellation of a Submit call is noticed within this (the handler polls between events).
constexpr auto kCancelPoll = std::chrono::milliseconds(5);
// gateway default when max_tokens is 0 (deltaserve.v1 GenerateRequest.max_tokens)
constexpr int32_t kDefaultMaxTokens = 256;
// Limits of the internal port (README "Submit contract"): the loop scans stop ids for every
// generated token, so their number is bounded; the gateway sends at most 256 of the client's plus
// the model's EOS ids. Priority is clamped to the public range, so a process on the internal port
// cannot jump every queue.
constexpr int kMaxStopIds = 1024;
constexpr int32_t kMinPriority = -10;
constexpr int32_t kMaxPriority = 10;

double SteadyNowSeconds() {
  return std::chrono::duration<double>(SteadyClock::now().time_since_epoch()).count();
}

v1::FinishReason ToProto(FinishReason r) {
  switch (r) {
    case FinishReason::kLength:
      return v1::FINISH_REASON_LENGTH;
    case FinishReason::kStop:
      return v1::FINISH_REASON_STOP;
    case FinishReason::kAborted:
      return v1::FINISH_REASON_CANCELLED;
    case FinishReason::kError:
      return v1::FINISH_REASON_ERROR;
  }
  return v1::FINISH_REASON_UNSPECIFIED;
}

double Sec(absl::Time a, absl::Time b) {
  if (a == absl::InfinitePast() || b == absl::InfinitePast()) return 0;
  return absl::ToDoubleSeconds(b - a);
}

void ToProto(const Event& e, const std::optional<TokenLogprobInfo>& lp, pb::RequestEvent* out) {
  switch (e.kind) {
    case Event::Kind::kStarted: {
      auto* a = out->mutable_admitted();
      a->set_slot(static_cast<uint32_t>(e.slot));
      a->set_queue_seconds(Sec(e.timings.arrival, e.timings.admitted));
      break;
    }
    case Event::Kind::kToken: {
      auto* t = out->mutable_token();
      t->set_id(e.token);
      if (lp) {
        auto* l = t->mutable_logprob();
        l->set_token_id(lp->token);
        l->set_logprob(lp->logprob);
        for (const auto& [id, v] : lp->top) {
          auto* top = l->add_top();
          top->set_token_id(id);
          top->set_logprob(v);
        }
      }
      break;
    }
    case Event::Kind::kFinished: {
      auto* f = out->mutable_finished();
      f->set_reason(ToProto(e.reason));
      f->set_error(e.detail);
      f->set_completion_tokens(static_cast<uint32_t>(e.n_generated));
      auto* t = f->mutable_timings();
      const RequestTimings& tm = e.timings;
      t->set_queue_seconds(Sec(tm.arrival, tm.admitted));
      t->set_time_to_first_token_seconds(Sec(tm.arrival, tm.first_token));
      t->set_total_seconds(Sec(tm.arrival, tm.finished));
      if (e.n_generated > 1)
        t->set_mean_inter_token_seconds(Sec(tm.first_token, tm.last_token) / (e.n_generated - 1));
      if (tm.answers > 0)
        t->set_tokens_per_step(static_cast<double>(e.n_generated) / tm.answers);
      for (size_t j = 0; j < tm.drafts_judged.size(); ++j) {
        t->add_drafts_judged(static_cast<uint32_t>(tm.drafts_judged[j]));
        t->add_drafts_accepted(static_cast<uint32_t>(tm.drafts_accepted[j]));
      }
      break;
    }
  }
}

void ToProto(const ClusterSnapshot& s, v1::ClusterStatus* out) {
  out->Clear();
  for (const ReplicaSnapshot& r : s.replicas) {
    auto* w = out->add_workers();
    w->set_id(r.worker.id);
    w->set_device(r.worker.device);
    w->set_ready(r.ready);
    w->set_heartbeat_age_seconds(r.heartbeat_age_s);
    w->set_weights_bytes(r.warmup.weights_bytes ? r.warmup.weights_bytes : r.worker.weights_bytes);
    w->set_kv_bytes(r.warmup.kv_bytes);
    w->set_state_bytes(r.warmup.state_bytes);
    w->set_workspace_bytes(r.warmup.workspace_bytes);
    w->set_warmup_decode_tokens_per_second(r.warmup.decode_tps);
    w->set_replica(static_cast<uint32_t>(r.id));
    w->set_slots(static_cast<uint32_t>(r.core.n_slots_target));
    w->set_running_requests(static_cast<uint32_t>(r.core.running));
    w->set_waiting_requests(static_cast<uint32_t>(r.core.queued));
    const PrefixCacheStats& pc = r.core.prefix_cache;
    v1::PrefixCacheStatus* c = w->mutable_prefix_cache();
    c->set_enabled(pc.budget_bytes > 0);
    c->set_tier(r.warmup.prefix_cache_tier);
    c->set_budget_bytes(pc.budget_bytes);
    c->set_bytes(pc.bytes);
    c->set_checkpoints(static_cast<uint32_t>(pc.checkpoints));
    c->set_lookups(pc.lookups);
    c->set_hits(pc.hits);
    c->set_prompt_tokens(pc.tokens_looked);
    c->set_tokens_saved(pc.tokens_saved);
    c->set_saves(pc.saves);
    c->set_evictions(pc.evictions);
    c->set_failures(pc.failures);
  }
  for (const SlotStatus& sl : s.core.slots) {
    auto* o = out->add_slots();
    o->set_index(static_cast<uint32_t>(sl.slot));
    o->set_request_id(sl.busy ? sl.id : 0);
    o->set_context_used(static_cast<uint32_t>(sl.ctx_used));
    o->set_context_reserved(static_cast<uint32_t>(sl.ctx_reserved));
    o->set_context_cap(static_cast<uint32_t>(s.core.per_slot_cap));
    o->set_retiring(sl.retiring);
  }
  auto* p = out->mutable_context_policy();
  p->set_split(s.core.policy.kind == ContextPolicy::Kind::kStatic ? v1::CONTEXT_SPLIT_STATIC
                                                                  : v1::CONTEXT_SPLIT_POOL);
  p->set_total_context(static_cast<uint32_t>(s.core.policy.n_ctx));
  p->set_slot_cap(static_cast<uint32_t>(s.core.policy.slot_cap));
  out->set_waiting_requests(static_cast<uint32_t>(s.core.queued));
  out->set_running_requests(static_cast<uint32_t>(s.core.running));
  out->set_queue_capacity(static_cast<uint32_t>(s.max_queue));
  out->set_context_reserved(static_cast<uint64_t>(s.core.pool_reserved));
  out->set_context_total(static_cast<uint64_t>(s.core.pool_total));
  out->set_draining(s.core.draining);
  out->set_serving(s.serving);
  if (!s.replicas.empty()) out->set_model(s.replicas.front().worker.model_fingerprint);
}

// The WorkerSession stream's writing half, handed to the loop.
class StreamLink final : public WorkerLink {
 public:
  StreamLink(grpc::ServerContext* ctx,
             grpc::ServerReaderWriter<pb::SchedulerMessage, pb::WorkerMessage>* stream)
      : ctx_(ctx), stream_(stream) {}

  bool Send(const pb::SchedulerMessage& m) override {
    std::lock_guard<std::mutex> l(mu_);
    if (done_) return false;
    return stream_->Write(m);
  }
  void Close(const absl::Status& why) override {
    std::lock_guard<std::mutex> l(mu_);
    if (done_ || closed_by_scheduler_) return;
    closed_by_scheduler_ = true;
    why_ = why;
    ctx_->TryCancel();  // unblocks the handler's Read
  }
  // Called by the handler before it returns: no Send may touch the stream afterwards.
  // Returns the status to end the call with and whether the scheduler closed it.
  std::pair<grpc::Status, bool> Done() {
    std::lock_guard<std::mutex> l(mu_);
    done_ = true;
    return {closed_by_scheduler_ ? ToGrpcStatus(why_) : grpc::Status::OK, closed_by_scheduler_};
  }

 private:
  grpc::ServerContext* ctx_;
  grpc::ServerReaderWriter<pb::SchedulerMessage, pb::WorkerMessage>* stream_;
  std::mutex mu_;
  bool done_ = false;
  bool closed_by_scheduler_ = false;
  absl::Status why_;
};

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

grpc::Status ClusterService::WorkerSession(
    grpc::ServerContext* ctx,
    grpc::ServerReaderWriter<pb::SchedulerMessage, pb::WorkerMessage>* stream) {
  if (grpc::Status a = auth::Check(*ctx, tokens_); !a.ok()) return a;
  pb::WorkerMessage m;
  if (!stream->Read(&m)) return grpc::Status(grpc::StatusCode::CANCELLED, "no register message");
  if (m.msg_case() != pb::WorkerMessage::kRegister)
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "the first WorkerSession message must be `register`");
  if (loop_->stopped())
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "scheduler shutting down");
  const pb::Register& r = m.register_();
  if (r.n_vocab() == 0)
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "register.n_vocab must be > 0");
  WorkerInfo info;
  info.id = r.worker_id().empty() ? ctx->peer() : r.worker_id();
  info.device = r.device();
  info.model_fingerprint = r.model_fingerprint();
  info.n_vocab = static_cast<int>(r.n_vocab());
  info.n_ctx_train = static_cast<int>(r.n_ctx_train());
  info.state_budget_bytes = r.state_budget_bytes();
  info.kv_bytes_per_token = r.kv_bytes_per_token();
  info.recurrent_bytes_per_slot = r.recurrent_bytes_per_slot();
  info.weights_bytes = r.weights_bytes();

  auto link = std::make_shared<StreamLink>(ctx, stream);
  link->last_heartbeat.store(SteadyNowSeconds());
  // A rank of a tensor-parallel group joins its group (worker_group.h); the group, not the rank,
  // is the loop's worker, so this rank's answers go through the group and are merged there.
  std::optional<GroupMember> member;
  if (r.tp_world() > 1) {
    auto mb = groups_.Join(TpJoin{r.tp_group(), static_cast<int>(r.tp_rank()),
                                  static_cast<int>(r.tp_world())},
                           info, link);
    if (!mb.ok()) return ToGrpcStatus(mb.status());
    member = std::move(*mb);
  } else {
    loop_->Push(WorkerJoinCmd{link, std::move(info)});
  }
  auto deliver = [&](Command c) {
    if (member) {
      groups_.FromRank(*member, std::move(c));
    } else {
      loop_->Push(std::move(c));
    }
  };

  std::string why = "stream ended";
  while (stream->Read(&m)) {
    switch (m.msg_case()) {
      case pb::WorkerMessage::kHeartbeat:
        link->last_heartbeat.store(SteadyNowSeconds());
        if (member) groups_.Heartbeat(*member, link->last_heartbeat.load());
        break;
      case pb::WorkerMessage::kWarmupDone: {
        const pb::WarmupDone& w = m.warmup_done();
        WarmupInfo wi;
        wi.decode_tps = w.decode_tokens_per_second();
        wi.prefill_tps = w.prefill_tokens_per_second();
        wi.weights_bytes = w.weights_bytes();
        wi.kv_bytes = w.kv_bytes();
        wi.state_bytes = w.state_bytes();
        wi.workspace_bytes = w.workspace_bytes();
        wi.kv_pool_tokens = static_cast<int64_t>(w.kv_pool_tokens());
        wi.kv_page_size = static_cast<int>(w.kv_page_size());
        wi.mtp_drafts = static_cast<int>(w.mtp_drafts());
        wi.mtp_auto = w.mtp_auto();
        wi.follows_work = w.follows_work();
        wi.active_slots = static_cast<int>(w.active_slots());
        wi.prefix_cache_bytes = w.prefix_cache_bytes();
        wi.prefix_cache_tier = w.prefix_cache_tier();
        deliver(WorkerWarmupCmd{link, wi});
        break;
      }
      case pb::WorkerMessage::kStepResult: {
        const pb::StepResult& sr = m.step_result();
        WorkerStepResult res;
        res.step_id = sr.step_id();
        res.error = sr.error();
        res.forward_seconds = sr.forward_seconds();
        res.sample_seconds = sr.sample_seconds();
        res.handle_seconds = sr.handle_seconds();
        for (const pb::CheckpointSaved& c : sr.checkpoints_saved())
          res.checkpoints_saved.emplace_back(c.id(), c.bytes());
        res.checkpoints_evicted.assign(sr.checkpoints_evicted().begin(),
                                       sr.checkpoints_evicted().end());
        res.checkpoints_failed.assign(sr.checkpoints_failed().begin(),
                                      sr.checkpoints_failed().end());
        res.drafts_offered.assign(sr.drafts_offered().begin(), sr.drafts_offered().end());
        res.tokens.reserve(static_cast<size_t>(sr.tokens_size()));
        for (const pb::SampledToken& t : sr.tokens()) {
          WorkerSampled ws;
          ws.slot = static_cast<int>(t.slot());
          ws.token = t.token();
          if (t.has_logprob()) {
            TokenLogprobInfo lp;
            lp.token = t.logprob().token_id();
            lp.logprob = t.logprob().logprob();
            for (const auto& top : t.logprob().top()) lp.top.emplace_back(top.token_id(), top.logprob());
            ws.logprob = std::move(lp);
          }
          res.tokens.push_back(std::move(ws));
        }
        deliver(WorkerStepCmd{link, std::move(res)});
        break;
      }
      case pb::WorkerMessage::kFatalError:
        why = "worker fatal error: " + m.fatal_error();
        deliver(WorkerGoneCmd{link, why});
        break;
      default:
        deliver(WorkerGoneCmd{link, "protocol error: unexpected message from the worker"});
        break;
    }
  }
  auto [status, by_scheduler] = link->Done();
  if (!by_scheduler) {
    if (ctx->IsCancelled()) why = "stream broken (worker gone)";
    deliver(WorkerGoneCmd{link, why});
  }
  if (member) groups_.Leave(*member, why);
  return status;
}

grpc::Status ClusterService::Submit(grpc::ServerContext* ctx, const pb::SubmitRequest* req,
                                    grpc::ServerWriter<pb::RequestEvent>* writer) {
  if (grpc::Status a = auth::Check(*ctx, tokens_); !a.ok()) return a;
  if (loop_->stopped()) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "scheduler shutting down");
  const int n_vocab = loop_->n_vocab();
  if (n_vocab == 0)
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "no worker is ready (cluster not serving)");
  if (req->prompt_ids().empty())
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "prompt_ids is empty");
  if (req->logprobs() > static_cast<uint32_t>(sampling::kMaxLogprobs))
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("logprobs ", req->logprobs(), " > ", sampling::kMaxLogprobs));
  if (req->stop_token_ids_size() > kMaxStopIds)
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("stop_token_ids has ", req->stop_token_ids_size(),
                                     " entries, at most ", kMaxStopIds, " allowed"));
  AddCmd add;
  Request& r = add.request;
  r.id = req->request_id() != 0 ? req->request_id() : next_auto_id_.fetch_add(1);
  r.prompt.assign(req->prompt_ids().begin(), req->prompt_ids().end());
  r.max_new_tokens = req->max_tokens() == 0 ? kDefaultMaxTokens
                                            : static_cast<int32_t>(std::min<uint32_t>(
                                                  req->max_tokens(), INT32_MAX));
  r.priority = std::clamp(req->priority(), kMinPriority, kMaxPriority);
  r.stop_ids.assign(req->stop_token_ids().begin(), req->stop_token_ids().end());
  // Checked with the rest of the request by Scheduler::Add (INVALID_ARGUMENT names them).
  r.checkpoint_hints.assign(req->checkpoint_hints().begin(), req->checkpoint_hints().end());
  r.arrival = absl::Now();
  if (req->deadline_unix_seconds() > 0)
    r.deadline = absl::FromUnixMicros(static_cast<int64_t>(req->deadline_unix_seconds() * 1e6));
  // Seed 0 stays 0 here: the worker draws a random seed.
  add.side.sampling = sampling::FromProto(req->sampling(), static_cast<int>(req->logprobs()));
  add.side.sampling.stop_ids = r.stop_ids;
  if (absl::Status s = sampling::Validate(add.side.sampling, n_vocab); !s.ok())
    return ToGrpcStatus(s);
  add.side.logprobs = static_cast<int>(req->logprobs());
  auto channel = std::make_shared<EventChannel>();
  add.side.channel = channel;
  const RequestId id = r.id;
  loop_->Push(std::move(add));

  pb::RequestEvent out;
  while (true) {
    std::optional<RequestEventItem> item = channel->Pop(kCancelPoll);
    if (!item) {
      if (ctx->IsCancelled()) {
        loop_->Push(AbortCmd{id, "client cancelled"});
        return grpc::Status(grpc::StatusCode::CANCELLED, "client cancelled");
      }
      continue;
    }
    if (!item->reject.ok()) return ToGrpcStatus(item->reject);
    out.Clear();
    ToProto(item->event, item->logprob, &out);
    const bool finished = item->event.kind == Event::Kind::kFinished;
    if (!writer->Write(out)) {
      if (!finished) loop_->Push(AbortCmd{id, "client stream closed"});
      return grpc::Status(grpc::StatusCode::CANCELLED, "client stream closed");
    }
    if (finished) {
      // The finished event carries the reason; UNAVAILABLE additionally tells the gateway the
      // request may be retried elsewhere (the worker was lost).
      if (item->unavailable)
        return grpc::Status(grpc::StatusCode::UNAVAILABLE, item->event.detail);
      return grpc::Status::OK;
    }
  }
}

grpc::Status ClusterService::RendezvousSet(grpc::ServerContext* ctx,
                                           const pb::RendezvousSetRequest* req,
                                           pb::RendezvousSetResponse*) {
  if (grpc::Status a = auth::Check(*ctx, tokens_); !a.ok()) return a;
  if (req->key().empty())
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "rendezvous key is empty");
  kv_.Set(req->key(), req->value());
  return grpc::Status::OK;
}

grpc::Status ClusterService::RendezvousGet(grpc::ServerContext* ctx,
                                           const pb::RendezvousGetRequest* req,
                                           pb::RendezvousGetResponse* resp) {
  if (grpc::Status a = auth::Check(*ctx, tokens_); !a.ok()) return a;
  // Capped so a waiting rank never pins a server thread for long; the client retries.
  const double wait = std::clamp(req->wait_seconds(), 0.0, 10.0);
  auto v = kv_.Get(req->key(), std::chrono::milliseconds(static_cast<int64_t>(wait * 1e3)));
  if (!v.ok()) return ToGrpcStatus(v.status());
  resp->set_value(std::move(*v));
  return grpc::Status::OK;
}

grpc::Status ClusterService::Finish(grpc::ServerContext* ctx, const pb::FinishRequest* req,
                                    pb::FinishResponse*) {
  if (grpc::Status a = auth::Check(*ctx, tokens_); !a.ok()) return a;
  FinishCmd c;
  c.id = req->request_id();
  switch (req->reason()) {
    case v1::FINISH_REASON_STOP:
      c.reason = FinishReason::kStop;
      break;
    case v1::FINISH_REASON_ERROR:
      c.reason = FinishReason::kError;
      break;
    case v1::FINISH_REASON_CANCELLED:
      c.reason = FinishReason::kAborted;
      break;
    default:
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "finish reason must be STOP, ERROR or CANCELLED");
  }
  c.detail = "finished by the gateway";
  c.done = std::make_shared<std::promise<absl::Status>>();
  auto f = c.done->get_future();
  loop_->Push(std::move(c));
  return ToGrpcStatus(f.get());
}

grpc::Status ClusterService::Admin(AdminCmd cmd, v1::ClusterStatus* resp, ClusterSnapshot* snap_out) {
  if (loop_->stopped()) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "scheduler shutting down");
  cmd.done = std::make_shared<std::promise<absl::StatusOr<ClusterSnapshot>>>();
  auto f = cmd.done->get_future();
  loop_->Push(std::move(cmd));
  absl::StatusOr<ClusterSnapshot> snap = f.get();
  if (!snap.ok()) return ToGrpcStatus(snap.status());
  if (resp) ToProto(*snap, resp);
  if (snap_out) *snap_out = std::move(*snap);
  return grpc::Status::OK;
}

grpc::Status ClusterService::GetClusterStatus(grpc::ServerContext* ctx,
                                              const v1::GetClusterStatusRequest*,
                                              v1::ClusterStatus* resp) {
  if (grpc::Status a = auth::Check(*ctx, tokens_); !a.ok()) return a;
  AdminCmd c;
  c.op = AdminCmd::Op::kStatus;
  return Admin(std::move(c), resp);
}

grpc::Status ClusterService::SetSlots(grpc::ServerContext* ctx, const v1::SetSlotsRequest* req,
                                      v1::ClusterStatus* resp) {
  if (grpc::Status a = auth::Check(*ctx, tokens_); !a.ok()) return a;
  AdminCmd c;
  c.op = AdminCmd::Op::kSetSlots;
  c.n_slots = static_cast<int>(std::min<uint32_t>(req->slots(), INT32_MAX));
  return Admin(std::move(c), resp);
}

grpc::Status ClusterService::SetContextPolicy(grpc::ServerContext* ctx,
                                              const v1::SetContextPolicyRequest* req,
                                              v1::ClusterStatus* resp) {
  if (grpc::Status a = auth::Check(*ctx, tokens_); !a.ok()) return a;
  AdminCmd c;
  c.op = AdminCmd::Op::kSetPolicy;
  const v1::ContextPolicy& p = req->policy();
  switch (p.split()) {
    case v1::CONTEXT_SPLIT_STATIC:
      c.policy.kind = ContextPolicy::Kind::kStatic;
      break;
    case v1::CONTEXT_SPLIT_POOL:
      c.policy.kind = ContextPolicy::Kind::kPool;
      break;
    default:
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "policy.split must be STATIC or POOL");
  }
  c.policy.n_ctx = p.total_context();
  c.policy.slot_cap = static_cast<int32_t>(std::min<uint32_t>(p.slot_cap(), INT32_MAX));
  return Admin(std::move(c), resp);
}

grpc::Status ClusterService::Drain(grpc::ServerContext* ctx, const v1::DrainRequest* req,
                                   v1::ClusterStatus* resp) {
  if (grpc::Status a = auth::Check(*ctx, tokens_); !a.ok()) return a;
  AdminCmd c;
  c.op = req->resume() ? AdminCmd::Op::kResume : AdminCmd::Op::kDrain;
  return Admin(std::move(c), resp);
}

grpc::Status ClusterService::GetStepStats(grpc::ServerContext* ctx, const pb::StepStatsRequest* req,
                                          pb::StepStats* resp) {
  if (grpc::Status a = auth::Check(*ctx, tokens_); !a.ok()) return a;
  AdminCmd c;
  c.op = req->reset() ? AdminCmd::Op::kStatsReset : AdminCmd::Op::kStatus;
  ClusterSnapshot snap;
  grpc::Status s = Admin(std::move(c), nullptr, &snap);
  if (!s.ok()) return s;
  const StepStatsSnapshot& st = snap.stats;
  resp->set_steps(st.steps);
  resp->set_steps_ahead(st.steps_ahead);
  resp->set_mean_us(st.mean_us);
  resp->set_p50_us(st.p50_us);
  resp->set_p90_us(st.p90_us);
  resp->set_p99_us(st.p99_us);
  resp->set_max_us(st.max_us);
  resp->set_mean_worker_us(st.mean_worker_us);
  resp->set_mean_schedule_us(st.mean_schedule_us);
  resp->set_mean_apply_us(st.mean_apply_us);
  for (double u : st.bucket_upper_us) resp->add_bucket_upper_us(u);
  for (uint64_t n : st.bucket_count) resp->add_bucket_count(n);
  return grpc::Status::OK;
}

}  // namespace ds::sched
