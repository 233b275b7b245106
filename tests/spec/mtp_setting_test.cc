// The one MTP switch (worker/spec/mtp_setting.h): what `--mtp` accepts, and the drafts `auto`
// allows a batch of each size.
#include "worker/spec/mtp_setting.h"

#include <gtest/gtest.h>

#include <string>

#include "common/sampling/sampling_params.h"

namespace ds::spec {
namespace {

TEST(MtpSetting, ParsesOffAutoAndEveryDraftCount) {
  for (const char* off : {"off", "0"}) {
    auto s = ParseMtpSetting(off);
    ASSERT_TRUE(s.ok()) << off;
    EXPECT_EQ(s->drafts, 0);
    EXPECT_FALSE(s->automatic);
  }
  auto a = ParseMtpSetting("auto");
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE(a->automatic);
  // Its draft count is the most it may draft (the speculative room a worker reserves).
  EXPECT_EQ(a->drafts, DraftsForBatch(*a, 1));
  // Every count a request's `mtp` field may carry (sampling::kMaxMtpDrafts) is a valid switch.
  for (int k = 1; k <= sampling::kMaxMtpDrafts; ++k) {
    auto s = ParseMtpSetting(std::to_string(k));
    ASSERT_TRUE(s.ok()) << k;
    EXPECT_EQ(s->drafts, k);
  }
  for (const char* bad : {"16", "-1", "4x", "", "on"})
    EXPECT_FALSE(ParseMtpSetting(bad).ok()) << "'" << bad << "'";
}

TEST(MtpSetting, AutoDraftsShrinkAsTheBatchGrows) {
  const MtpSetting automatic{0, true};
  // One or two streams: the card reads its weights either way, four drafts (the most measured
  // to pay at one stream on the demo model and the 27B, docs/perf/h200.md).
  EXPECT_EQ(DraftsForBatch(automatic, 1), 4);
  EXPECT_EQ(DraftsForBatch(automatic, 2), 4);
  EXPECT_EQ(DraftsForBatch(automatic, 3), 2);
  EXPECT_EQ(DraftsForBatch(automatic, 4), 2);
  EXPECT_EQ(DraftsForBatch(automatic, 8), 1);
  EXPECT_EQ(DraftsForBatch(automatic, 9), 0);
  EXPECT_EQ(DraftsForBatch(automatic, 64), 0);
  // A fixed K is K whatever the batch.
  const MtpSetting fixed{5, false};
  for (int batch : {1, 8, 64}) EXPECT_EQ(DraftsForBatch(fixed, batch), 5);
}

}  // namespace
}  // namespace ds::spec
