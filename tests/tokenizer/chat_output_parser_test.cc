// The streaming reasoning / tool-call parser: expected splits of whole outputs, and the same
// result for every way of cutting the text into chunks (every single split point, byte by byte,
// random multi-way splits).
#include "common/tokenizer/chat_output_parser.h"

#include <gtest/gtest.h>

#include <random>

namespace ds {
namespace {

using json = nlohmann::ordered_json;

struct Result {
  std::string reasoning, content;
  std::vector<std::string> calls;  // "id name args" per call, args concatenated
  bool operator==(const Result&) const = default;
};

// A call's first delta has its id and name and no arguments; later ones only argument text.
void Collect(const ParsedDelta& d, Result* r) {
  r->reasoning += d.reasoning;
  r->content += d.content;
  for (const ToolCallDelta& t : d.tool_calls) {
    if (!t.name.empty()) {
      ASSERT_FALSE(t.id.empty());
      ASSERT_EQ(static_cast<size_t>(t.index), r->calls.size()) << "calls come in index order";
      r->calls.push_back(t.id + " " + t.name + " ");
    } else {
      ASSERT_TRUE(t.id.empty()) << "an id after the call's first delta";
      ASSERT_FALSE(t.arguments.empty()) << "an empty delta";
    }
    ASSERT_FALSE(r->calls.empty()) << "arguments before the call's name";
    ASSERT_EQ(static_cast<size_t>(t.index) + 1, r->calls.size()) << "arguments of an older call";
    r->calls[static_cast<size_t>(t.index)] += t.arguments;
  }
}

Result Parse(const ChatOutputOptions& o, const std::vector<std::string_view>& chunks) {
  ChatOutputParser p(o);
  Result r;
  for (std::string_view c : chunks) Collect(p.Push(c), &r);
  Collect(p.Finish(), &r);
  return r;
}

ChatOutputOptions Opts(bool reasoning_open, bool tools) {
  ChatOutputOptions o;
  o.starts_in_reasoning = reasoning_open;
  o.parse_tool_calls = tools;
  o.tools = json::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"},
      "zip": {"type": "string"}, "days": {"type": "integer"}}}}}])");
  return o;
}

// Every split point, byte by byte, and random 2..8-way splits give the one-chunk result.
void ExpectSplitInvariant(const ChatOutputOptions& o, const std::string& text) {
  const Result whole = Parse(o, {text});
  for (size_t i = 0; i <= text.size(); ++i) {
    const std::string_view t(text);
    ASSERT_EQ(Parse(o, {t.substr(0, i), t.substr(i)}), whole) << "split at " << i;
  }
  std::vector<std::string_view> bytes;
  for (size_t i = 0; i < text.size(); ++i) bytes.push_back(std::string_view(text).substr(i, 1));
  ASSERT_EQ(Parse(o, bytes), whole) << "byte by byte";
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<size_t> cuts = {0, text.size()};
    const int n = std::uniform_int_distribution<int>(1, 7)(rng);
    for (int k = 0; k < n; ++k)
      cuts.push_back(std::uniform_int_distribution<size_t>(0, text.size())(rng));
    std::sort(cuts.begin(), cuts.end());
    std::vector<std::string_view> chunks;
    for (size_t k = 0; k + 1 < cuts.size(); ++k)
      chunks.push_back(std::string_view(text).substr(cuts[k], cuts[k + 1] - cuts[k]));
    ASSERT_EQ(Parse(o, chunks), whole) << "random split " << trial;
  }
}

TEST(ChatOutputParser, ReasoningThenAnswer) {
  const std::string out = "Let me think.\nStill thinking.\n</think>\n\nThe answer is 4.";
  const Result r = Parse(Opts(true, false), {out});
  EXPECT_EQ(r.reasoning, "Let me think.\nStill thinking.");
  EXPECT_EQ(r.content, "The answer is 4.");
  EXPECT_TRUE(r.calls.empty());
  ExpectSplitInvariant(Opts(true, false), out);
}

TEST(ChatOutputParser, ThinkingOffIsAllContent) {
  ChatOutputOptions o = Opts(false, false);
  const Result r = Parse(o, {"Plain answer with a < and </b> tag."});
  EXPECT_EQ(r.content, "Plain answer with a < and </b> tag.");
  EXPECT_EQ(r.reasoning, "");
}

TEST(ChatOutputParser, ModelOpenedThinkItself) {
  const std::string out = "\n<think>\nhmm\n</think>\n\nok";
  const Result r = Parse(Opts(false, false), {out});
  EXPECT_EQ(r.reasoning, "hmm");
  EXPECT_EQ(r.content, "ok");
  ExpectSplitInvariant(Opts(false, false), out);
}

TEST(ChatOutputParser, ToolCallAfterThinkAtEveryBoundary) {
  // The </think> -> <tool_call> boundary streaming clients lose on other servers.
  const std::string out =
      "I need the weather.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\n"
      "Paris\n</parameter>\n<parameter=zip>\n75001\n</parameter>\n<parameter=days>\n3\n"
      "</parameter>\n</function>\n</tool_call>";
  const Result r = Parse(Opts(true, true), {out});
  EXPECT_EQ(r.reasoning, "I need the weather.");
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.calls.size(), 1u);
  // zip is typed string by the schema (stays "75001"), days integer.
  EXPECT_EQ(r.calls[0], "call_0 get_weather {\"city\":\"Paris\",\"zip\":\"75001\",\"days\":3}");
  ExpectSplitInvariant(Opts(true, true), out);
}

TEST(ChatOutputParser, ContentThenTwoToolCalls) {
  const std::string out =
      "</think>\n\nChecking both.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nLyon\n"
      "</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=other>\n<parameter=q>\n"
      "{\"a\": [1, 2]}\n</parameter>\n<parameter=text>\nmulti\nline\n</parameter>\n</function>\n"
      "</tool_call>";
  const Result r = Parse(Opts(true, true), {out});
  EXPECT_EQ(r.reasoning, "");
  EXPECT_EQ(r.content, "Checking both.");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0], "call_0 get_weather {\"city\":\"Lyon\"}");
  // Unknown tool: values that parse as JSON become JSON, others stay strings.
  EXPECT_EQ(r.calls[1], "call_1 other {\"q\":{\"a\":[1,2]},\"text\":\"multi\\nline\"}");
  ExpectSplitInvariant(Opts(true, true), out);
}

TEST(ChatOutputParser, ToolCallInsideReasoningIsNotLost) {
  const std::string out =
      "thinking...\n<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n"
      "</function>\n</tool_call>";
  const Result r = Parse(Opts(true, true), {out});
  EXPECT_EQ(r.reasoning, "thinking...");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0], "call_0 get_weather {\"city\":\"Rome\"}");
  ExpectSplitInvariant(Opts(true, true), out);
}

TEST(ChatOutputParser, JsonToolCallsOfQwen3AndHermesTemplates) {
  const std::string out =
      "</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", "
      "\"days\": 2}}\n</tool_call>\n<tool_call>\n{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": "
      "1}\"}\n"
      "</tool_call>";
  const Result r = Parse(Opts(true, true), {out});
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0], "call_0 get_weather {\"city\":\"Oslo\",\"days\":2}");
  EXPECT_EQ(r.calls[1], "call_1 f {\"a\":1}");  // arguments given as a JSON string
  EXPECT_EQ(r.content, "");
  ExpectSplitInvariant(Opts(true, true), out);
  // JSON without a name is not a call.
  const Result bad =
      Parse(Opts(true, true), {"</think><tool_call>{\"arguments\": {}}</tool_call>"});
  EXPECT_TRUE(bad.calls.empty());
  EXPECT_EQ(bad.content, "<tool_call>{\"arguments\": {}}</tool_call>");
}

TEST(ChatOutputParser, MalformedOrUnfinishedToolCallComesBackAsContent) {
  const std::string bad = "</think>\nok <tool_call>\nnot xml\n</tool_call> after";
  const Result r = Parse(Opts(true, true), {bad});
  EXPECT_TRUE(r.calls.empty());
  EXPECT_EQ(r.content, "ok<tool_call>\nnot xml\n</tool_call>after");
  ExpectSplitInvariant(Opts(true, true), bad);
  // Cut off (max_tokens) inside a value: once `<function=NAME>` was complete the call was
  // streamed, so it stays a call, with its arguments closed where they stopped.
  const std::string cut = "</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nPa";
  const Result c = Parse(Opts(true, true), {cut});
  ASSERT_EQ(c.calls.size(), 1u);
  EXPECT_EQ(c.calls[0], "call_0 get_weather {\"city\":\"Pa\"}");
  EXPECT_EQ(c.content, "");
  ExpectSplitInvariant(Opts(true, true), cut);
  // Cut before the function tag was complete: nothing was streamed, it is content.
  const std::string head = "</think>\n\n<tool_call>\n<function=get_wea";
  const Result hc = Parse(Opts(true, true), {head});
  EXPECT_TRUE(hc.calls.empty());
  EXPECT_EQ(hc.content, "<tool_call>\n<function=get_wea");
  ExpectSplitInvariant(Opts(true, true), head);
  // Finished at </function> without </tool_call> (stopped by EOS): still a call.
  const std::string eos = "</think>\n<tool_call>\n<function=get_weather>\n</function>\n";
  const Result e = Parse(Opts(true, true), {eos});
  ASSERT_EQ(e.calls.size(), 1u);
  EXPECT_EQ(e.calls[0], "call_0 get_weather {}");
}

// Arguments stream while the model writes them: a string value's text before its
// </parameter>, a JSON-form object's members before it closes; the template's newline before
// </parameter> is held back until it is known not to be the last.
TEST(ChatOutputParser, ToolCallArgumentsStreamIncrementally) {
  ChatOutputParser p(Opts(false, true));
  std::string args;
  auto push = [&](std::string_view s) {
    ParsedDelta d = p.Push(s);
    for (const ToolCallDelta& t : d.tool_calls) args += t.arguments;
    return d;
  };
  EXPECT_TRUE(push("<tool_call>\n<function=get_wea").tool_calls.empty());
  ParsedDelta first = push("ther>\n");
  ASSERT_EQ(first.tool_calls.size(), 1u);
  EXPECT_EQ(first.tool_calls[0].name, "get_weather");
  EXPECT_EQ(first.tool_calls[0].id, "call_0");
  EXPECT_EQ(first.tool_calls[0].arguments, "");
  push("<parameter=city>\nNew Y");
  EXPECT_EQ(args, "{\"city\":\"New Y");
  push("ork \"NY\"\n");
  EXPECT_EQ(args, "{\"city\":\"New York \\\"NY\\\"");  // the newline may be the template's
  push("\n</parameter>\n<parameter=days>\n1");
  EXPECT_EQ(args, "{\"city\":\"New York \\\"NY\\\"\\n\",\"days\":");  // typed: whole
  push("4\n</parameter>\n</function>\n</tool_call>");
  push("");
  p.Finish();
  EXPECT_EQ(args, "{\"city\":\"New York \\\"NY\\\"\\n\",\"days\":14}");
  EXPECT_TRUE(nlohmann::json::parse(args).is_object());

  ChatOutputParser j(Opts(false, true));
  std::string jargs;
  auto jpush = [&](std::string_view s) {
    ParsedDelta d = j.Push(s);
    for (const ToolCallDelta& t : d.tool_calls) {
      if (!t.name.empty()) EXPECT_EQ(t.name, "get_weather");
      jargs += t.arguments;
    }
  };
  jpush("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Os");
  EXPECT_EQ(jargs, "{\"city\":\"Os");
  jpush("lo\", \"days\": [1, 2]}}\n</tool_call>");
  EXPECT_EQ(jargs, "{\"city\":\"Oslo\",\"days\":[1,2]}");
  EXPECT_EQ(j.n_tool_calls(), 1);
}

// Non-ASCII and escapes inside streamed values, at every split point (a piece never cuts a
// UTF-8 character, so every fragment is valid UTF-8 on its own).
TEST(ChatOutputParser, StreamedArgumentsWithUtf8AndEscapesAtEveryBoundary) {
  const std::string out =
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nS\xc3\xa3o Paulo \xe6\x9d\xb1\n"
      "\t\"q\" \\ \xf0\x9f\x98\x80\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n"
      "{\"name\": \"f\", \"arguments\": {\"s\": \"\xc3\xa9 \\\" }\", \"n\": {\"m\": [ ]}}}\n"
      "</tool_call>";
  const Result r = Parse(Opts(false, true), {out});
  ASSERT_EQ(r.calls.size(), 2u);
  const std::string a0 = r.calls[0].substr(r.calls[0].find('{'));
  EXPECT_EQ(nlohmann::json::parse(a0)["city"],
            "S\xc3\xa3o Paulo \xe6\x9d\xb1\n\t\"q\" \\ \xf0\x9f\x98\x80");
  EXPECT_EQ(r.calls[1], "call_1 f {\"s\":\"\xc3\xa9 \\\" }\",\"n\":{\"m\":[]}}");
  ExpectSplitInvariant(Opts(false, true), out);
  for (size_t i = 0; i <= out.size(); ++i) {
    ChatOutputParser p(Opts(false, true));
    for (std::string_view part :
         {std::string_view(out).substr(0, i), std::string_view(out).substr(i)}) {
      for (const ToolCallDelta& t : p.Push(part).tool_calls)
        EXPECT_NO_THROW((void)nlohmann::json(t.arguments).dump()) << "split at " << i;
    }
  }
}

TEST(ChatOutputParser, WithoutToolsTagsAreText) {
  const std::string out = "</think>\n<tool_call>\n<function=f>\n</function>\n</tool_call>";
  const Result r = Parse(Opts(true, false), {out});
  EXPECT_TRUE(r.calls.empty());
  EXPECT_EQ(r.content, "<tool_call>\n<function=f>\n</function>\n</tool_call>");
  ExpectSplitInvariant(Opts(true, false), out);
}

TEST(ChatOutputParser, UnfinishedReasoningAndTagLookalikes) {
  const std::string out = "a < b and <thinker> </thin\n\n";
  ExpectSplitInvariant(Opts(true, true), out);
  const Result r = Parse(Opts(true, true), {out});
  EXPECT_EQ(r.reasoning, out);  // never closed: all of it is reasoning, nothing dropped
  ExpectSplitInvariant(Opts(false, true), "x <tool_cal y\n <tool_call");
}

// Random texts made of tag pieces and fragments (a parser's worst case): every option mix gives
// the same result for every split point and byte-by-byte feeding, and loses no text when there
// is nothing to parse out.
TEST(ChatOutputParser, RandomTagSoupIsSplitInvariant) {
  const std::vector<std::string> pieces = {"<think>",
                                           "</think>",
                                           "<tool_call>",
                                           "</tool_call>",
                                           "<function=get_weather>",
                                           "</function>",
                                           "<parameter=city>",
                                           "</parameter>",
                                           "\n",
                                           "\n\n",
                                           " ",
                                           "a",
                                           "Paris",
                                           "<",
                                           "</",
                                           ">",
                                           "<tool",
                                           "_call>",
                                           "think>",
                                           "{\"k\": 1}",
                                           "{\"name\": \"f\"}"};
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 300; ++trial) {
    std::string text;
    const int n = std::uniform_int_distribution<int>(1, 14)(rng);
    for (int k = 0; k < n; ++k)
      text += pieces[std::uniform_int_distribution<size_t>(0, pieces.size() - 1)(rng)];
    for (const bool reasoning : {false, true})
      for (const bool tools : {false, true}) {
        const ChatOutputOptions o = Opts(reasoning, tools);
        const Result whole = Parse(o, {text});
        for (size_t i = 0; i <= text.size(); ++i) {
          const std::string_view t(text);
          ASSERT_EQ(Parse(o, {t.substr(0, i), t.substr(i)}), whole)
              << "split at " << i << " of '" << text << "'";
        }
        std::vector<std::string_view> bytes;
        for (size_t i = 0; i < text.size(); ++i)
          bytes.push_back(std::string_view(text).substr(i, 1));
        ASSERT_EQ(Parse(o, bytes), whole) << text;
        if (!reasoning && !tools && text.find("<think>") == std::string::npos) {
          // Plain answer: only leading whitespace may go.
          std::string want = text;
          want.erase(0, want.find_first_not_of(" \n"));
          if (want.find_first_not_of(" \n") == std::string::npos) want.clear();
          EXPECT_EQ(whole.content, want) << text;
        }
      }
  }
}

}  // namespace
}  // namespace ds
