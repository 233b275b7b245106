#include "common/tokenizer/chat_output_parser.h"

#include <algorithm>
#include <initializer_list>

namespace ds {
namespace {

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
constexpr std::string_view kToolOpen = "<tool_call>";
constexpr std::string_view kToolClose = "</tool_call>";

bool IsWs(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

std::string_view TrimWs(std::string_view s) {
  while (!s.empty() && IsWs(s.front())) s.remove_prefix(1);
  while (!s.empty() && IsWs(s.back())) s.remove_suffix(1);
  return s;
}

// Bytes at the end of `s` that could begin one of `tags` (a tag cut by the chunk boundary).
size_t PartialTagSuffix(std::string_view s, std::initializer_list<std::string_view> tags) {
  size_t best = 0;
  for (std::string_view t : tags)
    for (size_t k = std::min(t.size() - 1, s.size()); k > best; --k)
      if (s.substr(s.size() - k) == t.substr(0, k)) {
        best = k;
        break;
      }
  return best;
}

// Earliest occurrence of any of `tags`; npos if none. `which` gets the tag found.
size_t FindFirst(std::string_view s, std::initializer_list<std::string_view> tags,
                 std::string_view* which) {
  size_t best = std::string_view::npos;
  for (std::string_view t : tags) {
    if (t.empty()) continue;
    const size_t p = s.find(t);
    if (p < best) {
      best = p;
      *which = t;
    }
  }
  return best;
}

}  // namespace

void ParsedDelta::Append(ParsedDelta&& o) {
  reasoning += o.reasoning;
  content += o.content;
  for (auto& t : o.tool_calls) tool_calls.push_back(std::move(t));
}

ChatOutputParser::ChatOutputParser(ChatOutputOptions opts)
    : opts_(std::move(opts)),
      mode_(opts_.starts_in_reasoning && opts_.parse_reasoning ? Mode::kReasoning
                                                               : Mode::kContent) {}

ParsedDelta ChatOutputParser::Push(std::string_view text) {
  buf_.append(text);
  ParsedDelta d;
  Drain(/*final=*/false, &d);
  return d;
}

ParsedDelta ChatOutputParser::Finish() {
  ParsedDelta d;
  Drain(/*final=*/true, &d);
  return d;
}

std::string ChatOutputParser::ArgumentType(const std::string& fn, const std::string& param) const {
  for (const auto& tool : opts_.tools) {
    const auto f = tool.find("function");
    if (f == tool.end() || !f->is_object()) continue;
    const auto name = f->find("name");
    if (name == f->end() || !name->is_string() || name->get<std::string>() != fn) continue;
    const auto params = f->find("parameters");
    if (params == f->end() || !params->is_object()) return "";
    const auto props = params->find("properties");
    if (props == params->end() || !props->is_object()) return "";
    const auto p = props->find(param);
    if (p == props->end() || !p->is_object()) return "";
    const auto t = p->find("type");
    return t != p->end() && t->is_string() ? t->get<std::string>() : "";
  }
  return "";
}

bool ChatOutputParser::ParseToolCall(std::string_view body, ParsedDelta* out) {
  std::string_view s = TrimWs(body);
  // The JSON form (Qwen3 / Hermes templates): {"name": ..., "arguments": {...}}.
  if (!s.empty() && s.front() == '{') {
    const nlohmann::ordered_json j =
        nlohmann::ordered_json::parse(s, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) return false;
    const auto name = j.find("name");
    if (name == j.end() || !name->is_string() || name->get<std::string>().empty()) return false;
    nlohmann::ordered_json args = nlohmann::ordered_json::object();
    if (const auto a = j.find("arguments"); a != j.end()) {
      args = a->is_string() ? nlohmann::ordered_json::parse(a->get<std::string>(), nullptr, false)
                            : *a;
      if (!args.is_object()) return false;
    }
    ToolCallDelta d;
    d.index = n_calls_++;
    d.id = opts_.id_prefix + std::to_string(d.index);
    d.name = name->get<std::string>();
    d.arguments = args.dump();
    out->tool_calls.push_back(std::move(d));
    return true;
  }
  constexpr std::string_view kFn = "<function=", kFnEnd = "</function>";
  constexpr std::string_view kParam = "<parameter=", kParamEnd = "</parameter>";
  if (s.substr(0, kFn.size()) != kFn) return false;
  s.remove_prefix(kFn.size());
  const size_t gt = s.find('>');
  if (gt == std::string_view::npos || gt == 0) return false;
  const std::string name(s.substr(0, gt));
  if (name.find_first_of("<\n") != std::string::npos) return false;
  s.remove_prefix(gt + 1);
  nlohmann::ordered_json args = nlohmann::ordered_json::object();
  while (true) {
    s = TrimWs(s);
    if (s.empty() || s.substr(0, kFnEnd.size()) == kFnEnd) break;
    if (s.substr(0, kParam.size()) != kParam) return false;
    s.remove_prefix(kParam.size());
    const size_t pgt = s.find('>');
    if (pgt == std::string_view::npos || pgt == 0) return false;
    const std::string pname(s.substr(0, pgt));
    s.remove_prefix(pgt + 1);
    const size_t end = s.find(kParamEnd);
    if (end == std::string_view::npos) return false;
    std::string_view value = s.substr(0, end);
    s.remove_prefix(end + kParamEnd.size());
    // The template writes "\n" + value + "\n" around each value.
    if (!value.empty() && value.front() == '\n') value.remove_prefix(1);
    if (!value.empty() && value.back() == '\n') value.remove_suffix(1);
    const std::string type = ArgumentType(name, pname);
    nlohmann::ordered_json v;
    if (type != "string") {
      v = nlohmann::ordered_json::parse(value, nullptr, /*allow_exceptions=*/false);
      if (v.is_discarded()) v = std::string(value);
    } else {
      v = std::string(value);
    }
    args[pname] = std::move(v);
  }
  if (s.substr(0, kFnEnd.size()) == kFnEnd) s.remove_prefix(kFnEnd.size());
  if (!TrimWs(s).empty()) return false;
  ToolCallDelta d;
  d.index = n_calls_++;
  d.id = opts_.id_prefix + std::to_string(d.index);
  d.name = name;
  d.arguments = args.dump();
  out->tool_calls.push_back(std::move(d));
  return true;
}

void ChatOutputParser::Drain(bool final, ParsedDelta* out) {
  while (true) {
    std::string_view b = buf_;
    if (mode_ == Mode::kReasoning) {
      if (!reasoning_started_) {
        // A model that opens <think> itself (or the prompt's "<think>\n" echoed): skip it.
        size_t i = 0;
        while (i < b.size() && b[i] == '\n') ++i;
        std::string_view rest = b.substr(i);
        if (rest.substr(0, kThinkOpen.size()) == kThinkOpen) {
          buf_.erase(0, i + kThinkOpen.size());
          continue;
        }
        if (!final && kThinkOpen.substr(0, rest.size()) == rest) return;  // maybe "<thi"
        buf_.erase(0, i);
        b = buf_;
      }
      std::string_view tag;
      const size_t p = FindFirst(b, {kThinkClose, opts_.parse_tool_calls ? kToolOpen : ""}, &tag);
      if (p != std::string_view::npos) {
        std::string_view r = b.substr(0, p);
        while (!r.empty() && r.back() == '\n') r.remove_suffix(1);
        out->reasoning.append(r);
        reasoning_started_ = true;
        // A tool call inside the reasoning ends it (the call is not lost with the thinking).
        buf_.erase(0, tag == kThinkClose ? p + tag.size() : p);
        mode_ = Mode::kContent;
        content_started_ = false;
        continue;
      }
      size_t keep = final ? 0
                          : PartialTagSuffix(
                                b, {kThinkClose, opts_.parse_tool_calls ? kToolOpen : kThinkClose});
      if (!final)
        while (keep < b.size() && b[b.size() - keep - 1] == '\n') ++keep;
      out->reasoning.append(b.substr(0, b.size() - keep));
      if (b.size() > keep) reasoning_started_ = true;
      buf_.erase(0, b.size() - keep);
      return;
    }

    if (mode_ == Mode::kContent) {
      if (!content_started_) {
        size_t i = 0;
        while (i < b.size() && IsWs(b[i])) ++i;
        buf_.erase(0, i);
        b = buf_;
        if (b.empty()) return;
        // <think> opening the answer (a template that does not open it in the prompt).
        if (opts_.parse_reasoning && !reasoning_started_ && n_calls_ == 0) {
          if (b.substr(0, kThinkOpen.size()) == kThinkOpen) {
            buf_.erase(0, kThinkOpen.size());
            mode_ = Mode::kReasoning;
            continue;
          }
          if (!final && kThinkOpen.substr(0, b.size()) == b) return;
        }
      }
      if (!opts_.parse_tool_calls) {
        out->content.append(b);
        content_started_ = content_started_ || !b.empty();
        buf_.clear();
        return;
      }
      const size_t p = b.find(kToolOpen);
      if (p != std::string_view::npos) {
        out->content.append(TrimWs(b.substr(0, p)).empty() ? std::string_view() : b.substr(0, p));
        // Whitespace between the answer and the call is the template's, not the answer's.
        while (!out->content.empty() && IsWs(out->content.back())) out->content.pop_back();
        buf_.erase(0, p + kToolOpen.size());
        mode_ = Mode::kToolCall;
        continue;
      }
      size_t keep = final ? 0 : PartialTagSuffix(b, {kToolOpen});
      if (!final)
        while (keep < b.size() && IsWs(b[b.size() - keep - 1])) ++keep;
      out->content.append(b.substr(0, b.size() - keep));
      if (b.size() > keep) content_started_ = true;
      buf_.erase(0, b.size() - keep);
      return;
    }

    // Mode::kToolCall: buf_ holds what followed <tool_call>.
    const size_t p = b.find(kToolClose);
    if (p == std::string_view::npos && !final) return;
    const std::string_view body = p == std::string_view::npos ? b : b.substr(0, p);
    ParsedDelta call;
    if (ParseToolCall(body, &call)) {
      out->Append(std::move(call));
    } else {
      // Not the format: the text goes back to the client as it was written.
      out->content += std::string(kToolOpen) + std::string(body) +
                      (p == std::string_view::npos ? "" : std::string(kToolClose));
    }
    buf_.erase(0, p == std::string_view::npos ? b.size() : p + kToolClose.size());
    mode_ = Mode::kContent;
    content_started_ = false;
    if (buf_.empty()) return;
  }
}

}  // namespace ds
