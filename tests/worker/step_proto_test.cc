// The process edge of the step protocol (worker/process/step_proto.h): every field of Step and
// StepResult survives proto -> plain -> proto (and the reverse), each lands in the right plain
// field, and a converted result serializes to the bytes the executor used to write in place.
#include "worker/process/step_proto.h"

#include <string>

#include <gtest/gtest.h>

#include "common/sampling/sampling_params.h"

namespace ds {
namespace {

namespace pb = deltaserve::internal;
namespace v1 = deltaserve::v1;

// Every field set, none to its default, and none to a value the conversion maps (top_p inside
// (0, 1), repetition_penalty > 0, logprobs <= kMaxLogprobs).
pb::Step FullStep() {
  pb::Step s;
  s.set_step_id(0x1234567890ull);
  for (int i = 0; i < 2; ++i) {
    pb::SequenceStart* st = s.add_started();
    st->set_request_id(77 + i);
    st->set_slot(3 + i);
    for (int32_t t : {5, 0, 248319, 17 + i}) st->add_tokens(t);
    v1::SamplingParams* p = st->mutable_sampling();
    p->set_temperature(0.7f + i);
    p->set_top_k(40 + i);
    p->set_top_p(0.9f);
    p->set_min_p(0.05f);
    p->set_repetition_penalty(1.1f);
    p->set_presence_penalty(-0.5f);
    p->set_frequency_penalty(1.5f);
    p->set_seed(0xfeedbeefcafeull + i);
    st->set_logprobs(4 + i);
    st->set_n_generated(9 + i);
  }
  s.add_released(1);
  s.add_released(6);
  pb::SlotWork* w = s.add_work();
  w->set_slot(3);
  w->set_pos0(2);
  w->set_n_tokens(2);
  w->set_sample(true);
  w = s.add_work();
  w->set_slot(4);
  w->set_pos0(1);
  w->set_n_tokens(3);
  w->set_sample(false);
  w->set_follows(true);
  return s;
}

TEST(StepProto, StepFieldsLandInTheirPlainFieldsAndRoundTrip) {
  const pb::Step in = FullStep();
  worker::Step plain;
  worker::FromProto(in, &plain);

  EXPECT_EQ(plain.step_id, 0x1234567890ull);
  ASSERT_EQ(plain.started.size(), 2u);
  const worker::SequenceStart& st = plain.started[1];
  EXPECT_EQ(st.request_id, 78u);
  EXPECT_EQ(st.slot, 4u);
  EXPECT_EQ(st.tokens, (std::vector<int32_t>{5, 0, 248319, 18}));
  EXPECT_EQ(st.sampling.temperature, 1.7f);
  EXPECT_EQ(st.sampling.top_k, 41);
  EXPECT_EQ(st.sampling.top_p, 0.9f);
  EXPECT_EQ(st.sampling.min_p, 0.05f);
  EXPECT_EQ(st.sampling.repetition_penalty, 1.1f);
  EXPECT_EQ(st.sampling.presence_penalty, -0.5f);
  EXPECT_EQ(st.sampling.frequency_penalty, 1.5f);
  EXPECT_EQ(st.sampling.seed, 0xfeedbeefcafeull + 1);
  EXPECT_EQ(st.sampling.n_logprobs, 5);
  EXPECT_EQ(st.n_generated, 10u);
  EXPECT_EQ(plain.released, (std::vector<uint32_t>{1, 6}));
  ASSERT_EQ(plain.work.size(), 2u);
  EXPECT_EQ(plain.work[0].slot, 3u);
  EXPECT_EQ(plain.work[0].pos0, 2u);
  EXPECT_EQ(plain.work[0].n_tokens, 2u);
  EXPECT_TRUE(plain.work[0].sample);
  EXPECT_EQ(plain.work[1].slot, 4u);
  EXPECT_EQ(plain.work[1].pos0, 1u);
  EXPECT_EQ(plain.work[1].n_tokens, 3u);
  EXPECT_FALSE(plain.work[1].sample);
  EXPECT_FALSE(plain.work[0].follows);
  EXPECT_TRUE(plain.work[1].follows);

  pb::Step out;
  worker::ToProto(plain, &out);
  EXPECT_EQ(out.ShortDebugString(), in.ShortDebugString());
  EXPECT_EQ(out.SerializeAsString(), in.SerializeAsString());

  // A reused plain Step takes the next message whole: nothing of the larger one stays behind.
  pb::Step small;
  small.set_step_id(2);
  small.add_work()->set_slot(0);
  worker::FromProto(small, &plain);
  EXPECT_TRUE(plain.started.empty());
  EXPECT_TRUE(plain.released.empty());
  ASSERT_EQ(plain.work.size(), 1u);
  worker::ToProto(plain, &out);
  EXPECT_EQ(out.SerializeAsString(), small.SerializeAsString());
}

// The proto's "0 = disabled" become the sampler's neutral values; `logprobs` is capped at what the
// sampler returns.
TEST(StepProto, SamplingConventionsAndLogprobCap) {
  pb::Step in;
  pb::SequenceStart* st = in.add_started();
  st->add_tokens(1);
  st->set_logprobs(1000);
  worker::Step plain;
  worker::FromProto(in, &plain);
  const sampling::SamplingParams& p = plain.started[0].sampling;
  EXPECT_EQ(p.temperature, 0.0f);  // greedy
  EXPECT_EQ(p.top_p, 1.0f);
  EXPECT_EQ(p.repetition_penalty, 1.0f);
  EXPECT_EQ(p.seed, 0u);  // random, drawn by the executor
  EXPECT_EQ(p.n_logprobs, sampling::kMaxLogprobs);
}

worker::StepResult FullResult() {
  worker::StepResult r;
  r.step_id = 41;
  r.tokens.push_back(worker::SampledToken{2, 1234, std::nullopt});
  r.tokens.push_back(worker::SampledToken{
      5, 9, worker::TokenLogprob{9, -0.25f, {{9, -0.25f}, {11, -1.5f}, {0, -7.0f}}}});
  // Present but all zero: the message still carries an (empty) logprob.
  r.tokens.push_back(worker::SampledToken{0, 0, worker::TokenLogprob{}});
  r.forward_seconds = 0.0125;
  r.sample_seconds = 0.0003;
  r.error = "backend cpu: injected";
  r.handle_seconds = 0.02;
  return r;
}

TEST(StepProto, ResultRoundTripsAndKeepsLogprobPresence) {
  const worker::StepResult in = FullResult();
  pb::StepResult p;
  worker::ToProto(in, &p);
  ASSERT_EQ(p.tokens_size(), 3);
  EXPECT_FALSE(p.tokens(0).has_logprob());
  ASSERT_TRUE(p.tokens(1).has_logprob());
  EXPECT_EQ(p.tokens(1).logprob().top_size(), 3);
  EXPECT_EQ(p.tokens(1).logprob().top(1).token_id(), 11);
  EXPECT_EQ(p.tokens(1).logprob().top(1).logprob(), -1.5f);
  EXPECT_TRUE(p.tokens(2).has_logprob());
  EXPECT_EQ(p.error(), "backend cpu: injected");
  EXPECT_EQ(p.handle_seconds(), 0.02);

  worker::StepResult back = FullResult();  // reused: every field must be overwritten
  back.tokens[0].logprob = worker::TokenLogprob{1, 1.0f, {}};
  back.tokens.emplace_back();
  back.drafts_offered = {7};
  worker::FromProto(p, &back);
  EXPECT_EQ(back, in);

  // MTP: the drafts each sampled work's verify offered.
  worker::StepResult mtp = FullResult();
  mtp.drafts_offered = {0, 3, 2};
  worker::ToProto(mtp, &p);
  ASSERT_EQ(p.drafts_offered_size(), 3);
  EXPECT_EQ(p.drafts_offered(1), 3u);
  worker::FromProto(p, &back);
  EXPECT_EQ(back, mtp);
}

// What StepExecutor::Run used to fill in place, field by field, before the plain types: the bytes
// on the wire must not change.
TEST(StepProto, ResultBytesMatchTheProtoFilledInPlace) {
  pb::StepResult want;
  want.set_step_id(41);
  pb::SampledToken* t = want.add_tokens();
  t->set_slot(2);
  t->set_token(1234);
  t = want.add_tokens();
  t->set_slot(5);
  t->set_token(9);
  v1::TokenLogprob* lp = t->mutable_logprob();
  lp->set_token_id(9);
  lp->set_logprob(-0.25f);
  for (auto [id, l] : {std::pair{9, -0.25f}, {11, -1.5f}, {0, -7.0f}}) {
    v1::TopLogprob* top = lp->add_top();
    top->set_token_id(id);
    top->set_logprob(l);
  }
  t = want.add_tokens();
  t->set_slot(0);
  t->set_token(0);
  t->mutable_logprob();
  want.set_forward_seconds(0.0125);
  want.set_error("backend cpu: injected");
  want.set_sample_seconds(0.0003);
  want.set_handle_seconds(0.02);

  pb::StepResult got;
  worker::ToProto(FullResult(), &got);
  EXPECT_EQ(got.SerializeAsString(), want.SerializeAsString());
}

}  // namespace
}  // namespace ds
