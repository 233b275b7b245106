#include "gateway/proto_convert.h"

#include <algorithm>

namespace ds::gw {
namespace v1 = deltaserve::v1;
namespace {

void ChatFromProto(const v1::ChatMessages& c, GenerateInput* in) {
  in->kind = PromptKind::kChat;
  for (const v1::ChatMessage& m : c.messages()) in->chat.push_back({m.role(), m.content()});
}

}  // namespace

GenerateInput FromProto(const v1::GenerateRequest& r) {
  GenerateInput in;
  switch (r.prompt_case()) {
    case v1::GenerateRequest::kText:
      in.kind = PromptKind::kText;
      in.text = r.text();
      break;
    case v1::GenerateRequest::kChat:
      ChatFromProto(r.chat(), &in);
      break;
    case v1::GenerateRequest::kTokenIds:
      in.kind = PromptKind::kIds;
      in.ids.assign(r.token_ids().ids().begin(), r.token_ids().ids().end());
      break;
    default:
      in.kind = PromptKind::kNone;
  }
  const v1::SamplingParams& s = r.sampling();
  in.sampling.temperature = s.temperature();
  in.sampling.top_k = s.top_k();
  in.sampling.top_p = s.top_p();
  in.sampling.min_p = s.min_p();
  in.sampling.repetition_penalty = s.repetition_penalty();
  in.sampling.presence_penalty = s.presence_penalty();
  in.sampling.frequency_penalty = s.frequency_penalty();
  in.sampling.seed = s.seed();
  in.sampling.mtp = s.has_mtp() ? static_cast<int32_t>(std::min<uint32_t>(s.mtp(), 1u << 20)) : -1;
  in.sampling.json_object = s.json_object();
  in.max_tokens = r.max_tokens();
  in.stop.assign(r.stop().begin(), r.stop().end());
  in.stop_token_ids.assign(r.stop_token_ids().begin(), r.stop_token_ids().end());
  in.logprobs = r.logprobs();
  in.priority = r.priority();
  in.ignore_eos = r.ignore_eos();
  in.request_id = r.request_id();
  return in;
}

GenerateInput FromProto(const v1::TokenizeRequest& r) {
  GenerateInput in;
  if (r.input_case() == v1::TokenizeRequest::kText) {
    in.kind = PromptKind::kText;
    in.text = r.text();
  } else if (r.input_case() == v1::TokenizeRequest::kChat) {
    ChatFromProto(r.chat(), &in);
  }
  return in;
}

void ToProto(const OutputChunk& c, v1::GenerateResponse::Chunk* out) {
  out->set_text(c.text);
  out->mutable_token_ids()->Add(c.token_ids.begin(), c.token_ids.end());
  for (const TokenLogprob& lp : c.logprobs) {
    v1::TokenLogprob* o = out->add_logprobs();
    o->set_token_id(lp.token_id);
    o->set_logprob(lp.logprob);
    for (const TopLogprob& t : lp.top) {
      v1::TopLogprob* ot = o->add_top();
      ot->set_token_id(t.token_id);
      ot->set_logprob(t.logprob);
    }
  }
}

v1::FinishReason ToProto(FinishReason r) {
  switch (r) {
    case FinishReason::kLength:
      return v1::FINISH_REASON_LENGTH;
    case FinishReason::kStop:
      return v1::FINISH_REASON_STOP;
    case FinishReason::kCancelled:
      return v1::FINISH_REASON_CANCELLED;
    case FinishReason::kError:
      return v1::FINISH_REASON_ERROR;
    default:
      return v1::FINISH_REASON_UNSPECIFIED;
  }
}

void ToProto(const FinishInfo& f, v1::GenerateResponse::Finished* out) {
  out->set_reason(ToProto(f.reason));
  out->mutable_usage()->set_prompt_tokens(f.prompt_tokens);
  out->mutable_usage()->set_completion_tokens(f.completion_tokens);
  v1::Timings* t = out->mutable_timings();
  t->set_queue_seconds(f.timings.queue_seconds);
  t->set_time_to_first_token_seconds(f.timings.ttft_seconds);
  t->set_total_seconds(f.timings.total_seconds);
  t->set_mean_inter_token_seconds(f.timings.mean_itl_seconds);
  t->set_tokens_per_step(f.timings.tokens_per_step);
  t->mutable_drafts_judged()->Add(f.timings.drafts_judged.begin(), f.timings.drafts_judged.end());
  t->mutable_drafts_accepted()->Add(f.timings.drafts_accepted.begin(),
                                    f.timings.drafts_accepted.end());
  out->set_stop_string(f.stop_string);
}

}  // namespace ds::gw
