// The HTTP listener's parts without processes: OpenAI request bodies -> GenerateInput (and the
// errors naming the field), the status / error-shape mapping, logprob layouts, and the
// disconnect watch on real sockets.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "common/tokenizer/tokenizer.h"
#include "common/tokenizer/tokenizer_data.h"
#include "gateway/http/disconnect_watch.h"
#include "gateway/http/openai_request.h"
#include "gateway/http/openai_response.h"

namespace ds::gw::http {
namespace {

using namespace std::chrono_literals;

TEST(OpenAIRequest, ChatFieldsMapToTheSharedInput) {
  auto r = ParseChatRequest(R"({
    "model": "m", "stream": true, "stream_options": {"include_usage": true},
    "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
    "temperature": 0.5, "top_p": 0.9, "top_k": -1, "presence_penalty": 0.1, "frequency_penalty": 0.2,
    "repetition_penalty": 1.1, "min_p": 0.05, "seed": 42, "max_tokens": 7, "max_completion_tokens": 9,
    "stop": ["x", "yz"], "logprobs": true, "top_logprobs": 3, "user": "u",
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    "chat_template_kwargs": {"enable_thinking": false, "preserve_thinking": true}})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->chat && r->stream && r->include_usage);
  EXPECT_EQ(r->model, "m");
  EXPECT_FLOAT_EQ(r->input.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r->input.sampling.top_p, 0.9f);
  EXPECT_EQ(r->input.sampling.top_k, 0);
  EXPECT_FLOAT_EQ(r->input.sampling.presence_penalty, 0.1f);
  EXPECT_FLOAT_EQ(r->input.sampling.frequency_penalty, 0.2f);
  EXPECT_FLOAT_EQ(r->input.sampling.repetition_penalty, 1.1f);
  EXPECT_FLOAT_EQ(r->input.sampling.min_p, 0.05f);
  EXPECT_EQ(r->input.sampling.seed, 42u);
  EXPECT_EQ(r->input.max_tokens, 9u);  // max_completion_tokens wins
  EXPECT_EQ(r->input.stop, (std::vector<std::string>{"x", "yz"}));
  EXPECT_TRUE(r->logprobs);
  EXPECT_EQ(r->top_logprobs, 3);
  EXPECT_EQ(r->input.logprobs, 3u);
  ASSERT_EQ(r->messages.size(), 2u);
  EXPECT_EQ(*r->messages[1].content, "ab");
  EXPECT_TRUE(r->parse_tool_calls);
  EXPECT_EQ(r->render.tools.size(), 1u);
  ASSERT_TRUE(r->render.enable_thinking.has_value());
  EXPECT_FALSE(*r->render.enable_thinking);
  ASSERT_TRUE(r->render.preserve_thinking.has_value());
  EXPECT_TRUE(*r->render.preserve_thinking);
  // response_format json_object: constrained sampling; thinking off, no tool-call parsing.
  auto jo = ParseChatRequest(R"({"messages": [{"role": "user", "content": "x"}],
    "tools": [{"type": "function", "function": {"name": "f"}}],
    "response_format": {"type": "json_object"}})");
  ASSERT_TRUE(jo.ok()) << jo.status();
  EXPECT_TRUE(jo->input.sampling.json_object);
  ASSERT_TRUE(jo->render.enable_thinking.has_value());
  EXPECT_FALSE(*jo->render.enable_thinking);
  EXPECT_FALSE(jo->parse_tool_calls);
  EXPECT_EQ(jo->render.tools.size(), 1u);
  auto jc =
      ParseCompletionRequest(R"({"prompt": "x", "response_format": {"type": "json_object"}})");
  ASSERT_TRUE(jc.ok()) << jc.status();
  EXPECT_TRUE(jc->input.sampling.json_object);
  EXPECT_FALSE(ParseChatRequest(R"({"messages": [{"role": "user", "content": "x"}],
    "response_format": {"type": "text"}})")
                   ->input.sampling.json_object);
  // logprobs without alternatives still asks the sampler for the chosen token's.
  auto lp =
      ParseChatRequest(R"({"messages": [{"role": "user", "content": "x"}], "logprobs": true})");
  ASSERT_TRUE(lp.ok());
  EXPECT_EQ(lp->input.logprobs, 1u);
  EXPECT_EQ(lp->top_logprobs, 0);
  // tool_choice none: tools are neither rendered nor parsed.
  auto none = ParseChatRequest(R"({"messages": [{"role": "user", "content": "x"}],
      "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "none"})");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->parse_tool_calls);
  EXPECT_TRUE(none->render.tools.empty());
}

TEST(OpenAIRequest, CompletionPromptsAndLogprobs) {
  auto t = ParseCompletionRequest(R"({"prompt": "hi", "logprobs": 2, "stop": "s"})");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->input.sampling.mtp, -1);  // absent: the server's MTP setting
  auto m = ParseCompletionRequest(R"({"prompt": "hi", "mtp": 0})");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->input.sampling.mtp, 0);
  EXPECT_EQ(t->input.kind, PromptKind::kText);
  EXPECT_EQ(t->input.text, "hi");
  EXPECT_TRUE(t->logprobs);
  EXPECT_EQ(t->input.logprobs, 2u);
  EXPECT_EQ(t->input.stop, std::vector<std::string>{"s"});
  auto ids = ParseCompletionRequest(R"({"prompt": [[1, 2, 3]]})");
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(ids->input.kind, PromptKind::kIds);
  EXPECT_EQ(ids->input.ids, (std::vector<int32_t>{1, 2, 3}));
  auto one = ParseCompletionRequest(R"({"prompt": ["only"]})");
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->input.text, "only");
}

TEST(OpenAIRequest, RefusalsNameTheField) {
  auto expect = [](bool chat, const char* body, const char* needle) {
    auto r = chat ? ParseChatRequest(body) : ParseCompletionRequest(body);
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status();
  };
  const char* m = R"("messages": [{"role": "user", "content": "x"}])";
  auto chat = [&](const std::string& extra) { return "{" + std::string(m) + extra + "}"; };
  expect(true, "[]", "JSON object");
  expect(true, "{", "not valid JSON");
  expect(true, "{}", "messages is required");
  expect(true, chat(R"(, "temperature": "1")").c_str(), "temperature must be a number");
  expect(true, chat(R"(, "max_tokens": 0)").c_str(), "max_tokens must be in [1");
  expect(true, chat(R"(, "max_tokens": 1.5)").c_str(), "max_tokens must be an integer");
  expect(true, chat(R"(, "stop": [1])").c_str(), "stop[0] must be a string");
  expect(true, chat(R"(, "n": 3)").c_str(), "n must be 1");
  expect(true, chat(R"(, "top_logprobs": 2)").c_str(), "top_logprobs needs logprobs");
  expect(true, chat(R"(, "logprobs": true, "top_logprobs": 21)").c_str(),
         "top_logprobs must be in");
  expect(true, chat(R"(, "response_format": {"type": "json_schema"})").c_str(), "json_schema");
  expect(true, chat(R"(, "response_format": {"type": "yaml"})").c_str(), "json_object");
  expect(true,
         chat(R"(, "response_format": {"type": "json_object"},
                 "chat_template_kwargs": {"enable_thinking": true})")
             .c_str(),
         "enable_thinking");
  expect(true, chat(R"(, "tool_choice": "required")").c_str(), "tool_choice");
  expect(true, chat(R"(, "tools": [{"type": "function", "function": {}}])").c_str(),
         "tools[0].function.name");
  expect(true, chat(R"(, "stream": "yes")").c_str(), "stream must be true or false");
  expect(true, R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})",
         "messages[0].content[0]");
  expect(false, R"({})", "prompt is required");
  expect(false, R"({"prompt": ["a", "b"]})", "one prompt per request");
  expect(false, R"({"prompt": [1, -2]})", "prompt[1]");
  expect(false, R"({"prompt": "x", "echo": true})", "echo");
  expect(false, R"({"prompt": "x", "best_of": 2})", "best_of");
  expect(false, R"({"prompt": "x", "logprobs": 99})", "logprobs must be in");
  expect(false, R"({"prompt": "x", "mtp": 16})", "mtp must be in [0, 15]");
  // Finite as a double, infinite as the float it becomes (found by openai_request_fuzz).
  expect(false, R"({"prompt": "x", "repetition_penalty": 1e300})",
         "repetition_penalty must be finite");
  expect(true, chat(R"(, "temperature": -1e39)").c_str(), "temperature must be finite");
}

TEST(OpenAIResponse, StatusAndErrorShape) {
  EXPECT_EQ(HttpStatus(absl::StatusCode::kInvalidArgument), 400);
  EXPECT_EQ(HttpStatus(absl::StatusCode::kUnauthenticated), 401);
  EXPECT_EQ(HttpStatus(absl::StatusCode::kNotFound), 404);
  EXPECT_EQ(HttpStatus(absl::StatusCode::kResourceExhausted), 429);
  EXPECT_EQ(HttpStatus(absl::StatusCode::kUnavailable), 503);
  EXPECT_EQ(HttpStatus(absl::StatusCode::kDeadlineExceeded), 504);
  EXPECT_EQ(HttpStatus(absl::StatusCode::kInternal), 500);
  const json e = ErrorJson(absl::StatusCode::kResourceExhausted, "busy");
  EXPECT_EQ(
      Dump(e),
      R"({"error":{"message":"busy","type":"rate_limit_error","param":null,"code":"rate_limit_exceeded"}})");
  EXPECT_EQ(ErrorJson(absl::StatusCode::kUnauthenticated, "")["error"]["type"],
            "authentication_error");
  EXPECT_EQ(SseEvent(json{{"a", 1}}), "data: {\"a\":1}\n\n");
  EXPECT_EQ(FinishReasonJson(FinishReason::kStop, true), "tool_calls");
  EXPECT_EQ(FinishReasonJson(FinishReason::kStop, false), "stop");
  EXPECT_EQ(FinishReasonJson(FinishReason::kLength, true), "length");
  EXPECT_EQ(Dump(UsageJson(3, 4)), R"({"prompt_tokens":3,"completion_tokens":4,"total_tokens":7})");
}

TEST(OpenAIResponse, LogprobLayoutsSurviveHalfCharacters) {
  auto tok = Tokenizer::FromData(MakeTinyBpe(kMaxTinyMerges));
  ASSERT_TRUE(tok.ok());
  // Byte token 0xE2 alone is half of a UTF-8 character: bytes keep it, the JSON text is valid.
  const int32_t half = *tok->FindToken(std::string("\xE2"));  // the byte token 0xE2
  const int32_t a = *tok->FindToken("a");
  TokenLogprob lp{half, -0.5f, {{half, -0.5f}, {a, -1.0f}, {a, -2.0f}}};
  const json chat = ChatLogprobs(*tok, {lp}, 2);
  ASSERT_EQ(chat.size(), 1u);
  EXPECT_EQ(chat[0]["bytes"], json::array({0xE2}));
  EXPECT_EQ(chat[0]["token"], "bytes:\\xe2");
  EXPECT_EQ(chat[0]["top_logprobs"].size(), 2u);
  EXPECT_EQ(chat[0]["top_logprobs"][1]["token"], "a");
  EXPECT_NO_THROW(Dump(chat));
  CompletionLogprobs c;
  size_t off = 0;
  c.Add(*tok, {TokenLogprob{a, -0.25f, {{a, -0.25f}}}, lp}, 1, &off);
  const json cj = c.ToJson();
  EXPECT_EQ(cj["tokens"].size(), 2u);
  EXPECT_EQ(cj["text_offset"], json::array({0, 1}));
  EXPECT_FLOAT_EQ(cj["token_logprobs"][0].get<float>(), -0.25f);
  EXPECT_EQ(cj["top_logprobs"][0].size(), 1u);
  EXPECT_EQ(cj["tokens"][1], "bytes:\\xe2");
}

TEST(DisconnectWatch, FindsTheConnectionAndSeesThePeerClose) {
  const int lfd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(lfd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(lfd, 4), 0);
  socklen_t len = sizeof(addr);
  getsockname(lfd, reinterpret_cast<sockaddr*>(&addr), &len);
  const int server_port = ntohs(addr.sin_port);
  const int cfd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_EQ(connect(cfd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  const int sfd = accept(lfd, nullptr, nullptr);
  ASSERT_GE(sfd, 0);
  sockaddr_in client{};
  len = sizeof(client);
  getsockname(cfd, reinterpret_cast<sockaddr*>(&client), &len);
  const int client_port = ntohs(client.sin_port);

  // The server side of the connection, found by its addresses (as a handler would).
  EXPECT_EQ(FindConnectionSocket("127.0.0.1", server_port, "127.0.0.1", client_port), sfd);
  EXPECT_EQ(
      FindConnectionSocket("127.0.0.1", server_port, "127.0.0.1",
                           client_port + 1 == server_port ? client_port + 2 : client_port + 1),
      -1);

  DisconnectWatch w;
  std::atomic<int> fired{0};
  const uint64_t h = w.Add(sfd, [&] { ++fired; });
  // Unread data is not a disconnect.
  ASSERT_EQ(write(cfd, "x", 1), 1);
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(fired.load(), 0);
  EXPECT_FALSE(PeerClosed(sfd));
  close(cfd);
  const auto end = std::chrono::steady_clock::now() + 1s;
  while (fired.load() == 0 && std::chrono::steady_clock::now() < end)
    std::this_thread::sleep_for(1ms);
  EXPECT_EQ(fired.load(), 1);
  w.Remove(h);
  close(sfd);
  close(lfd);
}

}  // namespace
}  // namespace ds::gw::http
