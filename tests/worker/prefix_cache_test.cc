// Prefix cache (issue #17) end to end on the CPU: the scheduler core (prefix tree, checkpoint
// planning, resumes) drives a StepExecutor over the CPU backend and the tiny synth model, step by step
// as the daemon would (plan -> worker::Step -> Run -> StepResults -> Apply). Every scenario runs
// twice, with the cache and without it, and the generated tokens must be bit-identical (greedy
// and seeded), while the cache really resumes (hits, tokens saved) where it should: a chat's next
// turns, many requests sharing one long prefix that arrive together, a repeated short prompt,
// a budget so small that checkpoints are evicted, and a producer cancelled while others wait.
#include <gtest/gtest.h>

#include <functional>
#include <map>

#include "tests/worker/prefix_cache_harness.h"

namespace ds::prefix_test {
namespace {

TEST(PrefixCache, ChatTurnsResumeFromThePreviousAnswerAndMatchNoCache) {
  for (float temp : {0.0f, 0.8f}) {
    const Outcome off = Chat(0, temp), on = Chat(uint64_t{256} << 20, temp);
    EXPECT_EQ(on.out, off.out) << "temperature " << temp;
    EXPECT_EQ(off.cache.hits, 0u);
    // Turns 2 and 3 resume from the state the previous turn ended with: its prompt and all of
    // its answer but the last token (which it sampled, never computed).
    ASSERT_TRUE(on.resumed_at.contains(2) && on.resumed_at.contains(3));
    EXPECT_EQ(on.resumed_at.at(2), 150 + 10 - 1);
    EXPECT_EQ(on.resumed_at.at(3), 150 + 10 + 20 + 10 - 1);
    EXPECT_EQ(on.cache.hits, 2u);
    EXPECT_EQ(on.cache.tokens_saved, 159u + 189u);
    EXPECT_GT(on.store.used_bytes, 0u);
    EXPECT_EQ(on.cache.bytes, on.store.used_bytes);
    EXPECT_EQ(on.cache.checkpoints, on.store.checkpoints);
  }
}

// A chat whose template renders earlier answers differently from how they were generated (as
// Qwen3.5's drops the reasoning): turn 2 shares turn 1's prompt only up to the start of the
// assistant message, not turn 1's prompt end or answer end. With the gateway's message-start
// hints, turn 1 checkpoints there and turn 2 resumes there; without them nothing is reused. The
// tokens equal a run without the cache either way.
Outcome RerenderedChat(uint64_t cache_bytes, bool hints, float temp) {
  Outcome o;
  Harness h(cache_bytes);
  constexpr int32_t kStart = 250, kAssistant = 251, kThink = 252;  // <|im_start|> etc.
  std::vector<int32_t> history = Tokens(100, 4);  // system + first user message
  std::vector<int32_t> p1 = history;
  p1.insert(p1.end(), {kStart, kAssistant, kThink, 9});  // generation prompt, reasoning opened
  Spec t1 = Make(1, p1, 10, temp);
  if (hints) t1.req.checkpoint_hints = {100};
  h.Add(t1);
  EXPECT_TRUE(h.RunToEnd(&o));
  // Turn 2: the answer re-rendered without its reasoning, a new user message, a new prompt.
  std::vector<int32_t> p2 = history;
  p2.insert(p2.end(), {kStart, kAssistant, 9, 77, 78, 79});
  const std::vector<int32_t> user = Tokens(20, 12);
  p2.insert(p2.end(), user.begin(), user.end());
  const int32_t second_start = static_cast<int32_t>(p2.size());
  p2.insert(p2.end(), {kStart, kAssistant, kThink, 9});
  Spec t2 = Make(2, p2, 10, temp);
  if (hints) t2.req.checkpoint_hints = {100, second_start};
  h.Add(t2);
  EXPECT_TRUE(h.RunToEnd(&o));
  h.Finish(&o);
  return o;
}

TEST(PrefixCache, MessageStartHintsLetARerenderedChatResume) {
  for (float temp : {0.0f, 0.8f}) {
    const Outcome off = RerenderedChat(0, true, temp);
    const Outcome hinted = RerenderedChat(uint64_t{256} << 20, true, temp);
    const Outcome plain = RerenderedChat(uint64_t{256} << 20, false, temp);
    EXPECT_EQ(hinted.out, off.out) << "temperature " << temp;
    EXPECT_EQ(plain.out, off.out) << "temperature " << temp;
    ASSERT_TRUE(hinted.resumed_at.contains(2));
    EXPECT_EQ(hinted.resumed_at.at(2), 100);
    EXPECT_EQ(hinted.cache.hits, 1u);
    EXPECT_EQ(hinted.cache.tokens_saved, 100u);
    EXPECT_FALSE(plain.resumed_at.contains(2));
    EXPECT_EQ(plain.cache.hits, 0u);
  }
}

TEST(PrefixCache, RequestsSharingAPrefixResumeAtItsEnd) {
  const Outcome off = Agents(0), on = Agents(uint64_t{256} << 20);
  EXPECT_EQ(on.out, off.out);
  for (RequestId id = 2; id <= 6; ++id) {
    ASSERT_TRUE(on.resumed_at.contains(id)) << "request " << id << " did not resume";
    EXPECT_EQ(on.resumed_at.at(id), 200) << "request " << id;
  }
  EXPECT_EQ(on.cache.hits, 5u);
  EXPECT_EQ(on.cache.tokens_saved, 5u * 200u);
}

TEST(PrefixCache, CancelledProducerDoesNotStallTheOthers) {
  // Request 1 computes part of the prefix and is aborted: the waiting requests go on (one of them
  // saves the prefix instead) and every other output equals the run without the cache.
  const Outcome off = Agents(0, 1), on = Agents(uint64_t{256} << 20, 1);
  std::map<RequestId, std::vector<int32_t>> a = off.out, b = on.out;
  a.erase(1);
  b.erase(1);
  EXPECT_EQ(b, a);
  EXPECT_GE(on.cache.hits, 4u);
}

TEST(PrefixCache, RepeatedShortPromptResumesAtItsLastToken) {
  auto run = [](uint64_t bytes) {
    Outcome o;
    Harness h(bytes);
    const std::vector<int32_t> p = Tokens(40, 7);
    h.Add(Make(1, p, 5, 0.7f));
    EXPECT_TRUE(h.RunToEnd(&o));
    Spec again = Make(2, p, 5, 0.7f);
    again.seed = 1001;  // the same seed as the first: the same tokens
    h.Add(again);
    EXPECT_TRUE(h.RunToEnd(&o));
    h.Finish(&o);
    return o;
  };
  const Outcome off = run(0), on = run(uint64_t{64} << 20);
  EXPECT_EQ(on.out, off.out);
  EXPECT_EQ(on.out.at(1), on.out.at(2));
  ASSERT_TRUE(on.resumed_at.contains(2));
  EXPECT_EQ(on.resumed_at.at(2), 39);
}

TEST(PrefixCache, SmallBudgetEvictsAndStaysCorrect) {
  // Eight prompts, each extending the one before by 10 tokens: every request saves two or three
  // checkpoints and resumes from the one its predecessor saved at its last prompt token. A
  // budget for about two and a half checkpoints makes the store evict (never the one a step
  // restores), and the outputs still equal those without the cache.
  auto run = [](uint64_t bytes) {
    Outcome o;
    Harness h(bytes);
    for (RequestId id = 1; id <= 8; ++id) {
      h.Add(Make(id, Tokens(120 + 10 * static_cast<int>(id), 0), 4));
      EXPECT_TRUE(h.RunToEnd(&o));
    }
    h.Finish(&o);
    return o;
  };
  const Outcome probe = run(uint64_t{1} << 30);
  ASSERT_GT(probe.store.saves, 0u);
  const uint64_t one = probe.store.used_bytes / probe.store.checkpoints;
  const Outcome off = run(0), small = run(one * 2 + one / 2);
  EXPECT_EQ(small.out, off.out);
  EXPECT_GT(small.store.evictions, 0u);
  EXPECT_LE(small.store.used_bytes, one * 2 + one / 2);
  EXPECT_EQ(small.cache.evictions, small.store.evictions);
  EXPECT_EQ(small.cache.checkpoints, small.store.checkpoints);
  EXPECT_GT(small.cache.hits, 0u);
}

}  // namespace
}  // namespace ds::prefix_test
