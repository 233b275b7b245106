#include "common/tokenizer/chat_format.h"

#include <gtest/gtest.h>

#include "common/tokenizer/tokenizer.h"

namespace ds {
namespace {

TEST(ChatML, BasicConversation) {
  auto s = FormatChatML({{"system", "You are helpful."}, {"user", "Hi!"}, {"assistant", "Hello."},
                         {"user", "2+2?"}},
                        true);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(*s,
            "<|im_start|>system\nYou are helpful.<|im_end|>\n"
            "<|im_start|>user\nHi!<|im_end|>\n"
            "<|im_start|>assistant\nHello.<|im_end|>\n"
            "<|im_start|>user\n2+2?<|im_end|>\n"
            "<|im_start|>assistant\n");
  auto no_prompt = FormatChatML({{"user", "x"}}, false);
  ASSERT_TRUE(no_prompt.ok());
  EXPECT_EQ(*no_prompt, "<|im_start|>user\nx<|im_end|>\n");
}

TEST(ChatML, ToolResultsGroupedIntoOneUserTurn) {
  auto s = FormatChatML({{"user", "weather?"}, {"assistant", "calling"}, {"tool", "{\"t\": 20}"},
                         {"tool", "{\"t\": 21}"}, {"user", "thanks"}},
                        false);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(*s,
            "<|im_start|>user\nweather?<|im_end|>\n"
            "<|im_start|>assistant\ncalling<|im_end|>\n"
            "<|im_start|>user\n<tool_response>\n{\"t\": 20}\n</tool_response>"
            "\n<tool_response>\n{\"t\": 21}\n</tool_response><|im_end|>\n"
            "<|im_start|>user\nthanks<|im_end|>\n");
}

TEST(ChatML, RoleValidation) {
  auto bad = FormatChatML({{"user", "a"}, {"robot", "b"}}, true);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("messages[1]: invalid role 'robot'"), std::string::npos)
      << bad.status();
  auto late_system = FormatChatML({{"user", "a"}, {"system", "b"}}, true);
  ASSERT_FALSE(late_system.ok());
  EXPECT_NE(late_system.status().message().find("messages[1]: system"), std::string::npos);
  EXPECT_FALSE(FormatChatML({}, true).ok());
  EXPECT_FALSE(FormatChatML({{"User", "case matters"}}, true).ok());
}

TEST(ChatML, EncodesWithControlTokens) {
  auto tok = Tokenizer::FromData(MakeTinyBpe(300));
  ASSERT_TRUE(tok.ok());
  auto prompt = FormatChatML({{"user", "Hello there"}}, true);
  ASSERT_TRUE(prompt.ok());
  auto ids = tok->Encode(*prompt, true);
  ASSERT_TRUE(ids.ok());
  const int32_t start = tok->FindToken("<|im_start|>").value();
  const int32_t end = tok->FindToken("<|im_end|>").value();
  EXPECT_EQ(ids->front(), start);
  EXPECT_EQ(std::count(ids->begin(), ids->end(), start), 2);
  EXPECT_EQ(std::count(ids->begin(), ids->end(), end), 1);
  EXPECT_EQ(tok->Decode(*ids).value(), *prompt);
}

}  // namespace
}  // namespace ds
