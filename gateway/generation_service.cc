#include "gateway/generation_service.h"

#include <unistd.h>

#include <optional>

#include "absl/strings/str_cat.h"
#include "common/log/log.h"
#include "gateway/output_stream.h"
#include "gateway/proto_convert.h"
#include "gateway/status_map.h"

namespace ds::gw {
namespace v1 = deltaserve::v1;

absl::Status CheckAuth(const grpc::ServerContext& ctx, const KeySet& keys) {
  if (keys.open()) return absl::OkStatus();
  std::vector<std::string_view> values;
  const auto& md = ctx.client_metadata();
  for (auto [it, end] = md.equal_range("authorization"); it != end; ++it)
    values.emplace_back(it->second.data(), it->second.size());
  return keys.Check(values);
}

GenerationService::GenerationService(ServedModel model, SchedulerClient* scheduler,
                                     HealthMonitor* health, Admission* admission,
                                     const KeySet* keys)
    : model_(model),
      scheduler_(scheduler),
      health_(health),
      admission_(admission),
      keys_(keys),
      next_id_((static_cast<uint64_t>(getpid()) << 32) + 1) {}

ModelView GenerationService::View() const {
  ModelView v;
  v.tokenizer = model_.tokenizer;
  v.n_vocab = model_.n_vocab;
  v.slot_context = health_->view().slot_context;
  v.chat_template = model_.chat_template;
  v.encoder = model_.encoder;
  return v;
}

grpc::Status GenerationService::Tokenize(grpc::ServerContext* ctx, const v1::TokenizeRequest* req,
                                         v1::TokenizeResponse* resp) {
  if (absl::Status s = CheckAuth(*ctx, *keys_); !s.ok()) return ToPublicStatus(s);
  absl::StatusOr<std::vector<int32_t>> ids = TokenizePrompt(FromProto(*req), View());
  if (!ids.ok()) return ToPublicStatus(ids.status());
  resp->mutable_ids()->Add(ids->begin(), ids->end());
  return grpc::Status::OK;
}

namespace {

const char* ReasonName(FinishReason r) {
  switch (r) {
    case FinishReason::kUnspecified: return "";
    case FinishReason::kLength: return "length";
    case FinishReason::kStop: return "stop";
    case FinishReason::kCancelled: return "cancelled";
    case FinishReason::kError: return "error";
  }
  return "";
}

}  // namespace

grpc::Status GenerationService::Generate(grpc::ServerContext* ctx, const v1::GenerateRequest* req,
                                         grpc::ServerWriter<v1::GenerateResponse>* writer) {
  const auto t0 = std::chrono::steady_clock::now();
  metrics::GatewayMetrics::Request mr(metrics_);
  CallInfo info;
  // Logged only once it is known to be small and printable (else "-": the error says why).
  if (CheckRequestId(req->request_id()).ok()) info.public_id = req->request_id();
  const grpc::Status s = GenerateImpl(ctx, req, writer, &mr, &info);
  // gRPC and absl share the canonical code numbering.
  const metrics::Outcome outcome =
      metrics::OutcomeFromStatus(static_cast<absl::StatusCode>(s.error_code()));
  mr.Finish(outcome);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (outcome == metrics::Outcome::kSuccess || outcome == metrics::Outcome::kCancelled) {
    DS_LOG(INFO, "request_finished",
           {{"request_id", info.public_id.empty() ? std::string("-") : info.public_id},
            {"outcome", metrics::OutcomeName(outcome)},
            {"reason", info.finish_reason},
            {"prompt_tokens", info.prompt_tokens},
            {"completion_tokens", info.completion_tokens},
            {"duration_s", seconds},
            {"peer", ctx->peer()}});
  } else {
    DS_LOG(WARNING, "request_finished",
           {{"request_id", info.public_id.empty() ? std::string("-") : info.public_id},
            {"outcome", metrics::OutcomeName(outcome)},
            {"code", static_cast<int>(s.error_code())},
            {"error", s.error_message()},
            {"prompt_tokens", info.prompt_tokens},
            {"completion_tokens", info.completion_tokens},
            {"duration_s", seconds},
            {"peer", ctx->peer()}});
  }
  return s;
}

grpc::Status GenerationService::GenerateImpl(grpc::ServerContext* ctx,
                                             const v1::GenerateRequest* req,
                                             grpc::ServerWriter<v1::GenerateResponse>* writer,
                                             metrics::GatewayMetrics::Request* mr,
                                             CallInfo* info) {
  if (absl::Status s = CheckAuth(*ctx, *keys_); !s.ok()) return ToPublicStatus(s);
  if (draining_.load(std::memory_order_acquire))
    return ToPublicStatus(
        absl::UnavailableError("gateway is shutting down; retry on another instance"));
  const GenerateInput in = FromProto(*req);
  absl::StatusOr<PreparedRequest> prepared = Prepare(in, View());
  if (!prepared.ok()) return ToPublicStatus(prepared.status());

  std::optional<Admission::Permit> permit = admission_->TryAcquire();
  if (!permit)
    return ToPublicStatus(absl::ResourceExhaustedError(
        absl::StrCat("server overloaded: ", admission_->in_flight(), " requests in flight (limit ",
                     admission_->capacity(), "); retry with backoff")));

  const uint64_t id = next_id_.fetch_add(1);
  const std::string public_id = in.request_id.empty() ? absl::StrCat("gw-", id) : in.request_id;
  info->public_id = public_id;
  // Clients learn the id even when the call fails before any message (deltactl prints it).
  ctx->AddTrailingMetadata("x-request-id", public_id);
  // The scheduler's messages name its own numeric id; the client knows the public one.
  auto to_client = [&](const absl::Status& s) {
    return ToPublicStatus(WithPublicRequestId(scheduler_->Explain(s), id, public_id));
  };
  info->prompt_tokens = static_cast<uint32_t>(prepared->prompt_ids.size());
  std::unique_ptr<SchedulerClient::SubmitCall> call = scheduler_->Submit(id, *prepared, ctx);
  OutputStream out(model_.tokenizer, *prepared);

  v1::GenerateResponse msg;
  auto write = [&](auto fill) {
    msg.Clear();
    msg.set_request_id(public_id);
    fill(&msg);
    return writer->Write(msg);
  };
  auto client_gone = [&]() {
    call->Cancel();
    call->Finish().IgnoreError();
    return grpc::Status(grpc::StatusCode::CANCELLED, "client went away");
  };

  std::optional<InternalEvent> finished;
  InternalEvent ev;
  while (call->Next(&ev)) {
    if (ev.kind == InternalEvent::Kind::kAdmitted) {
      mr->Admitted(ev.queue_seconds, static_cast<uint32_t>(prepared->prompt_ids.size()));
      if (!write([&](v1::GenerateResponse* m) {
            m->mutable_started()->set_prompt_tokens(
                static_cast<uint32_t>(prepared->prompt_ids.size()));
          }))
        return client_gone();
    } else if (ev.kind == InternalEvent::Kind::kToken) {
      if (out.stopped()) continue;  // tokens already in flight when the stop string matched
      mr->Token();
      ++info->completion_tokens;
      OutputChunk c = out.Push(ev.token, ev.has_logprob ? &ev.logprob : nullptr);
      if (!c.empty() && !write([&](v1::GenerateResponse* m) { ToProto(c, m->mutable_chunk()); }))
        return client_gone();
      if (out.stopped()) {
        // The scheduler ends the request within a step; its `finished` event (with timings)
        // still comes through this stream. A failure here (request already finished) is benign.
        scheduler_->Finish(id, FinishReason::kStop).IgnoreError();
      }
    } else {
      finished = ev;
      break;
    }
  }
  const absl::Status internal = call->Finish();
  if (ctx->IsCancelled())
    return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the client");
  if (!finished) {
    // The stream ended without `finished`: rejected (validation, queue full, draining, no
    // worker) or the scheduler went away.
    if (internal.ok())
      return ToPublicStatus(absl::UnavailableError("scheduler ended the request without a result"));
    const absl::Status explained = scheduler_->Explain(internal);
    if (explained.code() == absl::StatusCode::kCancelled ||
        explained.code() == absl::StatusCode::kUnknown)
      return ToPublicStatus(absl::UnavailableError(
          absl::StrCat("scheduler connection lost: ", explained.message())));
    return ToPublicStatus(WithPublicRequestId(explained, id, public_id));
  }

  FinishInfo fin;
  fin.prompt_tokens = static_cast<uint32_t>(prepared->prompt_ids.size());
  fin.completion_tokens = out.n_tokens();
  fin.timings = finished->timings;
  if (out.stopped()) {
    fin.reason = FinishReason::kStop;
    fin.stop_string = out.stop_string();
  } else {
    fin.reason = finished->reason;
    if (finished->reason != FinishReason::kError) {
      OutputChunk tail = out.Finish();
      if (out.stopped()) {
        fin.reason = FinishReason::kStop;
        fin.stop_string = out.stop_string();
      }
      if (!tail.empty() &&
          !write([&](v1::GenerateResponse* m) { ToProto(tail, m->mutable_chunk()); }))
        return grpc::Status(grpc::StatusCode::CANCELLED, "client went away");
    }
  }
  info->finish_reason = ReasonName(fin.reason);
  info->completion_tokens = fin.completion_tokens;
  if (!write([&](v1::GenerateResponse* m) { ToProto(fin, m->mutable_finished()); }))
    return grpc::Status(grpc::StatusCode::CANCELLED, "client went away");

  switch (fin.reason) {
    case FinishReason::kError:
      // UNAVAILABLE (retryable) when the scheduler says the worker was lost.
      if (!internal.ok()) return to_client(internal);
      return to_client(absl::InternalError(finished->error));
    case FinishReason::kCancelled:
      // Aborted by the scheduler: the deadline passed there (the client's own cancel returned
      // above).
      return to_client(absl::DeadlineExceededError(
          finished->error.empty() ? "deadline exceeded" : finished->error));
    default:
      return grpc::Status::OK;
  }
}

}  // namespace ds::gw
