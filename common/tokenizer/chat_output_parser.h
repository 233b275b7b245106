// Splits a chat model's generated text into reasoning, answer content and tool calls, as it
// streams. Qwen3.5/3.6 write `reasoning\n</think>\n\nanswer` (the prompt already opened `<think>`)
// and tool calls as
//   <tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n</function>\n</tool_call>
//
// Push() may be fed any split of the text (a tag cut anywhere, even one byte at a time): text that
// could still be the start of a tag, and newlines that a following tag would swallow, are held
// back, so the concatenation of all deltas is the same for every split, and equal to one Push of
// the whole text followed by Finish(). A tool call is reported when its `<function=NAME>` tag is
// complete (id and name) and its arguments, as one JSON object string, when `</function>` is seen.
// Parameter values are typed by the tool's JSON schema (a `string` parameter stays a string;
// other values are parsed as JSON when they parse). The JSON form of Qwen3 / Hermes templates,
// `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`, is understood too. A
// `<tool_call>` that does not follow the format is given back as content at Finish. Not
// thread-safe; one per request.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace ds {

struct ToolCallDelta {
  int index = 0;
  std::string id;         // set in the first delta of a call
  std::string name;       // set in the first delta of a call
  std::string arguments;  // JSON text to append
};

struct ParsedDelta {
  std::string reasoning;
  std::string content;
  std::vector<ToolCallDelta> tool_calls;
  bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
  void Append(ParsedDelta&& o);
};

struct ChatOutputOptions {
  bool starts_in_reasoning = false;  // the prompt ended with an open <think>
  bool parse_reasoning = true;       // recognise <think> ... </think>
  bool parse_tool_calls = false;     // only when the request offered tools
  nlohmann::ordered_json tools = nlohmann::ordered_json::array();  // for parameter types
  std::string id_prefix = "call_";  // tool call ids are id_prefix + index
};

class ChatOutputParser {
 public:
  explicit ChatOutputParser(ChatOutputOptions opts);
  ParsedDelta Push(std::string_view text);
  ParsedDelta Finish();
  int n_tool_calls() const { return n_calls_; }

 private:
  enum class Mode { kContent, kReasoning, kToolCall };
  // Consumes what it can of buf_; `final` = no more text comes.
  void Drain(bool final, ParsedDelta* out);
  bool ParseToolCall(std::string_view body, ParsedDelta* out);
  std::string ArgumentType(const std::string& fn, const std::string& param) const;

  ChatOutputOptions opts_;
  Mode mode_;
  std::string buf_;
  bool content_started_ = false;  // leading newlines of an answer are dropped
  bool reasoning_started_ = false;
  int n_calls_ = 0;
};

}  // namespace ds
