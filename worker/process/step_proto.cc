#include "worker/process/step_proto.h"

#include <algorithm>

#include "proto/convert/sampling_proto.h"

namespace ds::worker {

namespace pb = deltaserve::internal;

void FromProto(const pb::Step& in, Step* out) {
  out->step_id = in.step_id();
  out->started.resize(static_cast<size_t>(in.started_size()));
  for (int i = 0; i < in.started_size(); ++i) {
    const pb::SequenceStart& p = in.started(i);
    SequenceStart& s = out->started[i];
    s.request_id = p.request_id();
    s.slot = p.slot();
    s.tokens.assign(p.tokens().begin(), p.tokens().end());
    const uint32_t n_logprobs = std::min<uint32_t>(p.logprobs(), sampling::kMaxLogprobs);
    s.sampling = sampling::FromProto(p.sampling(), static_cast<int>(n_logprobs));
    s.n_generated = p.n_generated();
    s.max_new_tokens = p.max_new_tokens();
    s.resume_checkpoint = p.resume_checkpoint();
    s.resume_len = p.resume_len();
  }
  out->released.assign(in.released().begin(), in.released().end());
  out->work.resize(static_cast<size_t>(in.work_size()));
  for (int i = 0; i < in.work_size(); ++i) {
    const pb::SlotWork& p = in.work(i);
    out->work[i] = SlotWork{p.slot(),        p.pos0(),       p.n_tokens(), p.sample(),
                            p.decode_path(), p.checkpoint(), p.follows()};
  }
  out->saves.resize(static_cast<size_t>(in.saves_size()));
  for (int i = 0; i < in.saves_size(); ++i)
    out->saves[i] = CheckpointSave{in.saves(i).slot(), in.saves(i).id(), in.saves(i).n_past()};
}

void ToProto(const Step& in, pb::Step* out) {
  out->Clear();
  out->set_step_id(in.step_id);
  for (const SequenceStart& s : in.started) {
    pb::SequenceStart* p = out->add_started();
    p->set_request_id(s.request_id);
    p->set_slot(s.slot);
    p->mutable_tokens()->Add(s.tokens.begin(), s.tokens.end());
    *p->mutable_sampling() = sampling::ToProto(s.sampling);
    p->set_logprobs(static_cast<uint32_t>(std::max(s.sampling.n_logprobs, 0)));
    p->set_n_generated(s.n_generated);
    p->set_max_new_tokens(s.max_new_tokens);
    p->set_resume_checkpoint(s.resume_checkpoint);
    p->set_resume_len(s.resume_len);
  }
  out->mutable_released()->Add(in.released.begin(), in.released.end());
  for (const SlotWork& w : in.work) {
    pb::SlotWork* p = out->add_work();
    p->set_slot(w.slot);
    p->set_pos0(w.pos0);
    p->set_n_tokens(w.n_tokens);
    p->set_sample(w.sample);
    p->set_decode_path(w.decode_path);
    p->set_checkpoint(w.checkpoint);
    p->set_follows(w.follows);
  }
  for (const CheckpointSave& c : in.saves) {
    pb::CheckpointSave* p = out->add_saves();
    p->set_slot(c.slot);
    p->set_id(c.id);
    p->set_n_past(c.n_past);
  }
}

void FromProto(const pb::StepResult& in, StepResult* out) {
  out->step_id = in.step_id();
  out->tokens.resize(static_cast<size_t>(in.tokens_size()));
  for (int i = 0; i < in.tokens_size(); ++i) {
    const pb::SampledToken& p = in.tokens(i);
    SampledToken& t = out->tokens[i];
    t.slot = p.slot();
    t.token = p.token();
    t.logprob.reset();
    if (!p.has_logprob()) continue;
    TokenLogprob& lp = t.logprob.emplace();
    lp.token_id = p.logprob().token_id();
    lp.logprob = p.logprob().logprob();
    for (const deltaserve::v1::TopLogprob& top : p.logprob().top())
      lp.top.push_back(TopLogprob{top.token_id(), top.logprob()});
  }
  out->forward_seconds = in.forward_seconds();
  out->sample_seconds = in.sample_seconds();
  out->error = in.error();
  out->handle_seconds = in.handle_seconds();
  out->checkpoints_saved.clear();
  for (const pb::CheckpointSaved& c : in.checkpoints_saved())
    out->checkpoints_saved.push_back(CheckpointSaved{c.id(), c.bytes()});
  out->checkpoints_evicted.assign(in.checkpoints_evicted().begin(), in.checkpoints_evicted().end());
  out->checkpoints_failed.assign(in.checkpoints_failed().begin(), in.checkpoints_failed().end());
  out->checkpoint_seconds = in.checkpoint_seconds();
  out->drafts_offered.assign(in.drafts_offered().begin(), in.drafts_offered().end());
}

void ToProto(const StepResult& in, pb::StepResult* out) {
  out->Clear();
  out->set_step_id(in.step_id);
  for (const SampledToken& t : in.tokens) {
    pb::SampledToken* p = out->add_tokens();
    p->set_slot(t.slot);
    p->set_token(t.token);
    if (!t.logprob) continue;
    deltaserve::v1::TokenLogprob* lp = p->mutable_logprob();
    lp->set_token_id(t.logprob->token_id);
    lp->set_logprob(t.logprob->logprob);
    for (const TopLogprob& top : t.logprob->top) {
      deltaserve::v1::TopLogprob* q = lp->add_top();
      q->set_token_id(top.token_id);
      q->set_logprob(top.logprob);
    }
  }
  out->set_forward_seconds(in.forward_seconds);
  out->set_sample_seconds(in.sample_seconds);
  out->set_error(in.error);
  out->set_handle_seconds(in.handle_seconds);
  for (const CheckpointSaved& c : in.checkpoints_saved) {
    pb::CheckpointSaved* p = out->add_checkpoints_saved();
    p->set_id(c.id);
    p->set_bytes(c.bytes);
  }
  out->mutable_checkpoints_evicted()->Add(in.checkpoints_evicted.begin(),
                                          in.checkpoints_evicted.end());
  out->mutable_checkpoints_failed()->Add(in.checkpoints_failed.begin(),
                                         in.checkpoints_failed.end());
  out->set_checkpoint_seconds(in.checkpoint_seconds);
  out->mutable_drafts_offered()->Add(in.drafts_offered.begin(), in.drafts_offered.end());
}

}  // namespace ds::worker
