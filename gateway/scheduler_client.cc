#include "gateway/scheduler_client.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/log/log.h"
#include "gateway/proto_convert.h"
#include "gateway/status_map.h"

namespace ds::gw {
namespace {

namespace pb = deltaserve::internal;
namespace v1 = deltaserve::v1;

// A cancelled client is noticed within this; the scheduler then aborts within one step.
constexpr auto kWatchdogPoll = std::chrono::milliseconds(10);

FinishReason FromProto(v1::FinishReason r) {
  switch (r) {
    case v1::FINISH_REASON_LENGTH:
      return FinishReason::kLength;
    case v1::FINISH_REASON_STOP:
      return FinishReason::kStop;
    case v1::FINISH_REASON_CANCELLED:
      return FinishReason::kCancelled;
    case v1::FINISH_REASON_ERROR:
      return FinishReason::kError;
    default:
      return FinishReason::kUnspecified;
  }
}

void Translate(const pb::RequestEvent& m, InternalEvent* ev) {
  *ev = InternalEvent{};
  switch (m.event_case()) {
    case pb::RequestEvent::kAdmitted:
      ev->kind = InternalEvent::Kind::kAdmitted;
      ev->slot = m.admitted().slot();
      ev->queue_seconds = m.admitted().queue_seconds();
      break;
    case pb::RequestEvent::kToken:
      ev->kind = InternalEvent::Kind::kToken;
      ev->token = m.token().id();
      if (m.token().has_logprob()) {
        const v1::TokenLogprob& lp = m.token().logprob();
        ev->has_logprob = true;
        ev->logprob.token_id = lp.token_id();
        ev->logprob.logprob = lp.logprob();
        for (const v1::TopLogprob& t : lp.top())
          ev->logprob.top.push_back({t.token_id(), t.logprob()});
      }
      break;
    case pb::RequestEvent::kFinished: {
      const pb::RequestEvent::Finished& f = m.finished();
      ev->kind = InternalEvent::Kind::kFinished;
      ev->reason = FromProto(f.reason());
      ev->error = f.error();
      ev->completion_tokens = f.completion_tokens();
      ev->timings.queue_seconds = f.timings().queue_seconds();
      ev->timings.ttft_seconds = f.timings().time_to_first_token_seconds();
      ev->timings.total_seconds = f.timings().total_seconds();
      ev->timings.mean_itl_seconds = f.timings().mean_inter_token_seconds();
      ev->timings.tokens_per_step = f.timings().tokens_per_step();
      ev->timings.drafts_judged.assign(f.timings().drafts_judged().begin(),
                                       f.timings().drafts_judged().end());
      ev->timings.drafts_accepted.assign(f.timings().drafts_accepted().begin(),
                                         f.timings().drafts_accepted().end());
      break;
    }
    default:
      ev->kind = InternalEvent::Kind::kFinished;
      ev->reason = FinishReason::kError;
      ev->error = "internal protocol error: empty RequestEvent";
  }
}

}  // namespace

CancelWatchdog::CancelWatchdog() : thread_([this] { Run(); }) {}

CancelWatchdog::~CancelWatchdog() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void CancelWatchdog::Add(grpc::ServerContext* client, grpc::ClientContext* internal) {
  std::lock_guard<std::mutex> l(mu_);
  calls_[internal] = client;
}

void CancelWatchdog::Remove(grpc::ClientContext* internal) {
  std::lock_guard<std::mutex> l(mu_);
  calls_.erase(internal);
}

void CancelWatchdog::Run() {
  std::unique_lock<std::mutex> l(mu_);
  while (!stop_) {
    cv_.wait_for(l, kWatchdogPoll);
    // Under the lock: Remove() (called before either context dies) waits for this scan.
    for (auto& [internal, client] : calls_)
      if (client->IsCancelled()) internal->TryCancel();
  }
}

grpc::ChannelArguments SchedulerClient::Args() {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  // Reconnect quickly after the scheduler restarts (default backoff grows to 120 s).
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  return args;
}

SchedulerClient::SchedulerClient(const std::string& address) : address_(address) {
  channel_ = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), Args());
  stub_ = pb::Scheduler::NewStub(channel_);
}

absl::StatusOr<std::unique_ptr<SchedulerClient>> SchedulerClient::Create(
    const std::string& address, const auth::ClientTlsFiles& tls, const std::string& token) {
  std::unique_ptr<SchedulerClient> c(new SchedulerClient());
  c->address_ = address;
  DS_ASSIGN_OR_RETURN(c->channel_, auth::MakeChannel(address, tls, token, Args()));
  c->stub_ = pb::Scheduler::NewStub(c->channel_);
  return c;
}

SchedulerClient::SubmitCall::~SubmitCall() {
  if (watchdog_) watchdog_->Remove(&ctx_);
}

bool SchedulerClient::SubmitCall::Next(InternalEvent* ev) {
  if (!reader_->Read(&msg_)) return false;
  Translate(msg_, ev);
  return true;
}

absl::Status SchedulerClient::SubmitCall::Finish() {
  if (watchdog_) {
    watchdog_->Remove(&ctx_);
    watchdog_ = nullptr;
  }
  return FromInternal(reader_->Finish());
}

std::unique_ptr<SchedulerClient::SubmitCall> SchedulerClient::Submit(uint64_t request_id,
                                                                     const PreparedRequest& req,
                                                                     grpc::ServerContext* client) {
  std::unique_ptr<SubmitCall> call(new SubmitCall());
  pb::SubmitRequest m;
  m.set_request_id(request_id);
  m.mutable_prompt_ids()->Add(req.prompt_ids.begin(), req.prompt_ids.end());
  m.set_max_tokens(req.max_tokens);
  v1::SamplingParams* s = m.mutable_sampling();
  s->set_temperature(req.sampling.temperature);
  s->set_top_k(req.sampling.top_k);
  s->set_top_p(req.sampling.top_p);
  s->set_min_p(req.sampling.min_p);
  s->set_repetition_penalty(req.sampling.repetition_penalty);
  s->set_presence_penalty(req.sampling.presence_penalty);
  s->set_frequency_penalty(req.sampling.frequency_penalty);
  s->set_seed(req.sampling.seed);
  if (req.sampling.mtp >= 0) s->set_mtp(static_cast<uint32_t>(req.sampling.mtp));
  s->set_json_object(req.sampling.json_object);
  m.mutable_stop_token_ids()->Add(req.stop_ids.begin(), req.stop_ids.end());
  m.mutable_checkpoint_hints()->Add(req.checkpoint_hints.begin(), req.checkpoint_hints.end());
  m.set_logprobs(req.logprobs);
  m.set_priority(req.priority);
  m.set_ignore_eos(req.ignore_eos);
  if (client) {
    const auto deadline = client->deadline();
    if (deadline != std::chrono::system_clock::time_point::max()) {
      // The call's own deadline (below) ends the stream; this one lets the scheduler drop the
      // request while it still waits in the queue.
      m.set_deadline_unix_seconds(
          std::chrono::duration<double>(deadline.time_since_epoch()).count());
      call->ctx_.set_deadline(deadline);
    }
    call->watchdog_ = &watchdog_;
    watchdog_.Add(client, &call->ctx_);
  }
  call->reader_ = stub_->Submit(&call->ctx_, m);
  return call;
}

absl::Status SchedulerClient::Finish(uint64_t request_id, FinishReason reason) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  pb::FinishRequest req;
  req.set_request_id(request_id);
  req.set_reason(ToProto(reason));
  pb::FinishResponse resp;
  return FromInternal(stub_->Finish(&ctx, req, &resp));
}

absl::Status SchedulerClient::Explain(const absl::Status& s) const {
  using C = absl::StatusCode;
  if (s.ok() || (s.code() != C::kUnavailable && s.code() != C::kUnknown &&
                 s.code() != C::kInternal && s.code() != C::kCancelled))
    return s;
  // The scheduler's own refusals arrive over a healthy connection; after a transport failure the
  // channel is no longer READY (gRPC moves it to IDLE / TRANSIENT_FAILURE at once).
  if (channel_->GetState(false) == GRPC_CHANNEL_READY) return s;
  DS_LOG(WARNING, "scheduler_unreachable", {{"scheduler", address_}, {"detail", s}});
  return absl::UnavailableError(absl::StrCat(
      "scheduler unreachable at ", address_,
      " (connection refused or lost; the cluster is restarting or down): retry later"));
}

absl::StatusOr<ClusterView> SchedulerClient::Poll(std::chrono::milliseconds timeout) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + timeout);
  v1::GetClusterStatusRequest req;
  v1::ClusterStatus st;
  DS_RETURN_IF_ERROR(FromInternal(stub_->GetClusterStatus(&ctx, req, &st)));
  ClusterView v;
  v.reachable = true;
  v.serving = st.serving();
  v.draining = st.draining();
  v.slots = static_cast<uint32_t>(st.slots_size());
  for (const v1::SlotStatus& s : st.slots())
    if (!s.retiring() && s.context_cap() > 0)
      v.slot_context = std::max(v.slot_context, s.context_cap());
  return v;
}

}  // namespace ds::gw
