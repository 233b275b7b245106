// Splits a chat model's generated text into reasoning, answer content and tool calls, as it
// streams. Qwen3.5/3.6 write `reasoning\n</think>\n\nanswer` (the prompt already opened `<think>`)
// and tool calls as
//   <tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n</function>\n</tool_call>
//
// Push() may be fed any split of the text (a tag cut anywhere, even one byte at a time): text that
// could still be the start of a tag, and newlines that a following tag would swallow, are held
// back, so the concatenation of all deltas is the same for every split, and equal to one Push of
// the whole text followed by Finish().
//
// Tool calls stream as OpenAI clients accumulate them: the first delta of a call carries its
// index, id and name (and no arguments), later deltas pieces of the arguments' JSON text as they
// become certain; concatenated they are the call's arguments, for every split of the text.
//  - XML form: the call is committed when `<function=NAME>` is complete. Each
//    `<parameter=P>` adds `{"P":` (or `,"P":`); a value typed `string` by the tool's schema streams
//    as escaped JSON string text while it is written (the template's newline before
//    `</parameter>` is held back until it is known not to be the last); other values (numbers,
//    objects, unknown tools) are parsed as JSON when `</parameter>` comes, else kept as strings.
//    `</function>` (or `</tool_call>`, or the end of the text) closes the object.
//  - JSON form of Qwen3 / Hermes templates, `<tool_call>\n{"name": ..., "arguments": {...}}`:
//    committed when `"arguments":` follows the name; an object value streams with the whitespace
//    outside strings dropped; arguments given as a JSON string come whole when it closes. Other
//    key orders are parsed whole at `</tool_call>`.
// Once committed a call stays a call: text after its arguments up to `</tool_call>` is dropped,
// and a cut-off (max_tokens) ends the arguments where they got (the XML form's object closed,
// the JSON form's as written). A `<tool_call>`
// whose head follows neither form is given back as content at `</tool_call>` or Finish. Not
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
  // Inside a tool call: before the head is known, between XML parameters, inside a value, the
  // JSON form's arguments, and after the arguments (until </tool_call>).
  enum class Phase { kHead, kXmlBetween, kXmlValue, kJsonValue, kJsonObject, kTail };
  // Consumes what it can of buf_; `final` = no more text comes.
  void Drain(bool final, ParsedDelta* out);
  // One step of a tool call over buf_: true when it consumed or decided something (call again),
  // false when it needs more text.
  bool DrainCall(bool final, ParsedDelta* out);
  // Appends argument text to the committed call.
  void Args(std::string_view text, ParsedDelta* out);
  void EndCall();
  bool ParseToolCall(std::string_view body, ParsedDelta* out);
  std::string ArgumentType(const std::string& fn, const std::string& param) const;

  ChatOutputOptions opts_;
  Mode mode_;
  std::string buf_;
  bool content_started_ = false;  // leading newlines of an answer are dropped
  bool reasoning_started_ = false;
  int n_calls_ = 0;
  // The tool call being parsed.
  Phase phase_ = Phase::kHead;
  std::string fn_;             // its function name
  bool any_param_ = false;     // XML: a parameter was written (',' before the next)
  bool value_string_ = false;  // XML: the current value streams as a JSON string
  bool value_started_ = false;
  int depth_ = 0;  // JSON form: nesting inside the arguments object
  bool in_string_ = false, escape_ = false;
};

}  // namespace ds
