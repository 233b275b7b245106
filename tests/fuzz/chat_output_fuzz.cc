// libFuzzer target for the chat output parser (common/tokenizer/chat_output_parser.h): the text a
// model generates is split into reasoning, content and tool calls while it streams, and a model's
// text can be anything. Checks:
//  - what a client receives does not depend on how the text arrived: pushed in arbitrary chunks
//    (as tokens split it) it gives the same reasoning, content and tool calls as pushed whole;
//  - every tool call has an id and a name in its first delta and indices count up from 0;
//  - the arguments of an XML-form call are one JSON object, even when the text is cut off (the
//    parser closes it); a JSON-form call's are the model's text as written, so only texts
//    without '{' (where every call is in the XML form) are held to this;
//  - every delta's reasoning, content and argument text is well-formed UTF-8 (each is sent as a
//    JSON string in its own server-sent event).
// Input: byte 0 picks the options, byte 1 seeds the chunk sizes, the rest is the text, made
// well-formed UTF-8 first as the server's streaming decoder does (IncrementalDecoder), and cut
// into chunks at character boundaries, as that decoder emits them.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/chat_output_parser.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

void Check(bool cond, const char* what) { ds::fuzz::Check(cond, "chat_output_fuzz", what); }

struct Call {
  std::string id, name, arguments;
};

struct Parsed {
  std::string reasoning, content;
  std::vector<Call> calls;
};

// Folds deltas into whole calls, checking the delta protocol on the way.
void Fold(ds::ParsedDelta&& d, Parsed* p) {
  Check(ds::fuzz::ValidUtf8(d.reasoning) && ds::fuzz::ValidUtf8(d.content),
        "a delta's text is well-formed UTF-8");
  p->reasoning += d.reasoning;
  p->content += d.content;
  for (ds::ToolCallDelta& t : d.tool_calls) {
    Check(ds::fuzz::ValidUtf8(t.arguments) && ds::fuzz::ValidUtf8(t.name),
          "a call delta is well-formed UTF-8");
    Check(t.index >= 0 && t.index <= static_cast<int>(p->calls.size()), "call indices count up");
    if (t.index == static_cast<int>(p->calls.size())) {
      Check(!t.id.empty() && !t.name.empty(), "a call's first delta has its id and name");
      p->calls.push_back({t.id, t.name, ""});
    } else {
      Check(t.id.empty() && t.name.empty(), "id and name only in a call's first delta");
    }
    p->calls[t.index].arguments += t.arguments;
  }
}

ds::ChatOutputOptions Options(uint8_t b) {
  ds::ChatOutputOptions o;
  o.starts_in_reasoning = b & 1;
  o.parse_reasoning = b & 2;
  o.parse_tool_calls = b & 4;
  if (b & 8) {
    o.tools = nlohmann::ordered_json::parse(R"([
      {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                       "units": {"type": "object"}, "exact": {"type": "boolean"}}}}},
      {"type": "function", "function": {"name": "f", "parameters": {}}}
    ])");
  }
  o.id_prefix = "call_7_";
  return o;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const ds::ChatOutputOptions opts = Options(data[0]);
  uint32_t seed = data[1] * 2654435761u + 1;
  std::string text;
  ds::tok::AppendSanitizedUtf8(std::string_view(reinterpret_cast<const char*>(data + 2), size - 2),
                               /*final=*/true, &text);

  Parsed whole;
  {
    ds::ChatOutputParser p(opts);
    Fold(p.Push(text), &whole);
    Fold(p.Finish(), &whole);
    Check(p.n_tool_calls() == static_cast<int>(whole.calls.size()), "n_tool_calls");
  }
  Parsed chunked;
  {
    ds::ChatOutputParser p(opts);
    size_t at = 0;
    while (at < text.size()) {
      seed = seed * 1103515245u + 12345u;
      size_t end = std::min<size_t>(text.size(), at + 1 + (seed >> 16) % 7);
      while (end < text.size() && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) ++end;
      Fold(p.Push(std::string_view(text).substr(at, end - at)), &chunked);
      at = end;
    }
    Fold(p.Finish(), &chunked);
  }
  Check(whole.reasoning == chunked.reasoning, "reasoning independent of chunking");
  Check(whole.content == chunked.content, "content independent of chunking");
  Check(whole.calls.size() == chunked.calls.size(), "tool calls independent of chunking");
  for (size_t i = 0; i < whole.calls.size(); ++i) {
    Check(whole.calls[i].id == chunked.calls[i].id && whole.calls[i].name == chunked.calls[i].name,
          "call heads independent of chunking");
    Check(whole.calls[i].arguments == chunked.calls[i].arguments,
          "call arguments independent of chunking");
    if (text.find('{') == std::string::npos) {
      const auto args = nlohmann::json::parse(whole.calls[i].arguments, nullptr, false);
      Check(!args.is_discarded() && args.is_object(), "XML-form arguments are one JSON object");
    }
  }
  return 0;
}
