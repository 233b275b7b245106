#include "common/tokenizer/chat_output_parser.h"

#include <algorithm>
#include <initializer_list>

namespace ds {
namespace {

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
constexpr std::string_view kToolOpen = "<tool_call>";
constexpr std::string_view kToolClose = "</tool_call>";
constexpr std::string_view kFn = "<function=", kFnEnd = "</function>";
constexpr std::string_view kParam = "<parameter=", kParamEnd = "</parameter>";

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

enum class Match { kYes, kMore, kNo };

// `lit` at s[*i] (advancing past it), a cut prefix of it (kMore), or something else.
Match Literal(std::string_view s, size_t* i, std::string_view lit) {
  const std::string_view rest = s.substr(*i);
  if (rest.size() < lit.size())
    return lit.substr(0, rest.size()) == rest ? Match::kMore : Match::kNo;
  if (rest.substr(0, lit.size()) != lit) return Match::kNo;
  *i += lit.size();
  return Match::kYes;
}

void SkipWs(std::string_view s, size_t* i) {
  while (*i < s.size() && IsWs(s[*i])) ++*i;
}

// `<function=NAME>` after optional whitespace: the name and the length up to '>'.
Match XmlHead(std::string_view s, std::string* name, size_t* len) {
  size_t i = 0;
  SkipWs(s, &i);
  if (i == s.size()) return Match::kMore;
  if (const Match m = Literal(s, &i, kFn); m != Match::kYes) return m;
  const size_t gt = s.find('>', i);
  const std::string_view n = s.substr(i, gt == std::string_view::npos ? s.npos : gt - i);
  if (n.find_first_of("<\n") != std::string_view::npos) return Match::kNo;
  if (gt == std::string_view::npos) return Match::kMore;
  if (n.empty()) return Match::kNo;
  *name = std::string(n);
  *len = gt + 1;
  return Match::kYes;
}

// The end of the JSON string that starts at s[i] == '"' (one past its closing quote), or npos.
size_t StringEnd(std::string_view s, size_t i) {
  for (size_t k = i + 1; k < s.size(); ++k) {
    if (s[k] == '\\') {
      ++k;
    } else if (s[k] == '"') {
      return k + 1;
    }
  }
  return std::string_view::npos;
}

// `{"name": "NAME", "arguments":` (any JSON whitespace): the name and the length up to the ':'.
Match JsonHead(std::string_view s, std::string* name, size_t* len) {
  size_t i = 0;
  auto lit = [&](std::string_view l) {
    SkipWs(s, &i);
    return i == s.size() ? Match::kMore : Literal(s, &i, l);
  };
  for (std::string_view l :
       {std::string_view("{"), std::string_view("\"name\""), std::string_view(":")})
    if (const Match m = lit(l); m != Match::kYes) return m;
  SkipWs(s, &i);
  if (i == s.size()) return Match::kMore;
  if (s[i] != '"') return Match::kNo;
  const size_t end = StringEnd(s, i);
  if (end == std::string_view::npos) return Match::kMore;
  const nlohmann::json n = nlohmann::json::parse(s.substr(i, end - i), nullptr, false);
  if (n.is_discarded() || !n.is_string() || n.get<std::string>().empty()) return Match::kNo;
  i = end;
  for (std::string_view l :
       {std::string_view(","), std::string_view("\"arguments\""), std::string_view(":")})
    if (const Match m = lit(l); m != Match::kYes) return m;
  *name = n.get<std::string>();
  *len = i;
  return Match::kYes;
}

// The JSON string body (no quotes) of `text`; invalid UTF-8 is replaced, never thrown.
std::string EscapeJson(std::string_view text) {
  const std::string q = nlohmann::json(std::string(text))
                            .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return q.substr(1, q.size() - 2);
}

// Start of an incomplete UTF-8 sequence at the end of s (s.size() when it ends on a boundary), so
// a streamed piece never cuts a character.
size_t Utf8Boundary(std::string_view s) {
  for (size_t k = 1; k <= 3 && k <= s.size(); ++k) {
    const unsigned char c = static_cast<unsigned char>(s[s.size() - k]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: look further back
    const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return need > k ? s.size() - k : s.size();
  }
  return s.size();
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
    if (!DrainCall(final, out)) return;
    if (mode_ == Mode::kContent && buf_.empty()) return;
  }
}

void ChatOutputParser::Args(std::string_view text, ParsedDelta* out) {
  if (text.empty()) return;
  // Pieces of one Push go into one delta of the call.
  if (!out->tool_calls.empty() && out->tool_calls.back().index == n_calls_ - 1) {
    out->tool_calls.back().arguments.append(text);
    return;
  }
  ToolCallDelta d;
  d.index = n_calls_ - 1;
  d.arguments = std::string(text);
  out->tool_calls.push_back(std::move(d));
}

void ChatOutputParser::EndCall() {
  mode_ = Mode::kContent;
  content_started_ = false;
  phase_ = Phase::kHead;
}

bool ChatOutputParser::DrainCall(bool final, ParsedDelta* out) {
  std::string_view b = buf_;
  const size_t close = b.find(kToolClose);
  switch (phase_) {
    case Phase::kHead: {
      // Only the text before </tool_call> can hold a head: the same decision for every split.
      const std::string_view head = b.substr(0, close);
      std::string name;
      size_t len = 0;
      const Match xml = XmlHead(head, &name, &len);
      const Match js = xml == Match::kYes ? Match::kNo : JsonHead(head, &name, &len);
      if (xml == Match::kYes || js == Match::kYes) {
        ToolCallDelta d;
        d.index = n_calls_++;
        d.id = opts_.id_prefix + std::to_string(d.index);
        d.name = name;
        out->tool_calls.push_back(std::move(d));
        fn_ = name;
        any_param_ = false;
        buf_.erase(0, len);
        phase_ = xml == Match::kYes ? Phase::kXmlBetween : Phase::kJsonValue;
        return true;
      }
      // Not (yet) a streamable head: the whole call is parsed at </tool_call> (or the end).
      if (close == std::string_view::npos && !final) return false;
      const std::string_view body = b.substr(0, close);
      ParsedDelta call;
      if (ParseToolCall(body, &call)) {
        out->Append(std::move(call));
      } else {
        // Not the format: the text goes back to the client as it was written.
        out->content += std::string(kToolOpen) + std::string(body) +
                        (close == std::string_view::npos ? "" : std::string(kToolClose));
      }
      buf_.erase(0, close == std::string_view::npos ? b.size() : close + kToolClose.size());
      EndCall();
      return true;
    }
    case Phase::kXmlBetween: {
      // Whitespace between the tags is the template's.
      size_t i = 0;
      SkipWs(b, &i);
      buf_.erase(0, i);
      b = buf_;
      size_t at = 0;
      const Match param = Literal(b, &at, kParam);
      if (param == Match::kYes) {
        const size_t gt = b.find('>', at);
        const std::string_view pname =
            b.substr(at, gt == std::string_view::npos ? b.npos : gt - at);
        const bool bad = pname.find_first_of("<\n") != std::string_view::npos ||
                         (gt != std::string_view::npos && pname.empty());
        if (!bad && gt != std::string_view::npos) {
          Args(std::string(any_param_ ? "," : "{") +
                   nlohmann::json(std::string(pname))
                       .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) +
                   ":",
               out);
          any_param_ = true;
          value_string_ = ArgumentType(fn_, std::string(pname)) == "string";
          value_started_ = false;
          buf_.erase(0, gt + 1);
          phase_ = Phase::kXmlValue;
          return true;
        }
        if (!bad && !final) return false;  // the name is still being written
      } else if (!final) {
        size_t a = 0, c = 0;
        if (b.empty() || param == Match::kMore || Literal(b, &a, kFnEnd) == Match::kMore ||
            Literal(b, &c, kToolClose) == Match::kMore)
          return false;  // a tag still being written
      }
      // </function>, </tool_call>, the end of the text, or something else: the arguments end.
      Args(any_param_ ? "}" : "{}", out);
      at = 0;
      if (Literal(b, &at, kFnEnd) == Match::kYes) buf_.erase(0, at);
      phase_ = Phase::kTail;
      return true;
    }
    case Phase::kXmlValue: {
      // The value ends at </parameter>, or at </tool_call> when that comes first.
      const size_t pend = b.find(kParamEnd);
      const size_t end = std::min(pend, close);
      if (!value_string_) {
        if (end == std::string_view::npos && !final) return false;
        std::string_view v = b.substr(0, end);
        if (!v.empty() && v.front() == '\n') v.remove_prefix(1);
        if (!v.empty() && v.back() == '\n') v.remove_suffix(1);
        nlohmann::ordered_json j = nlohmann::ordered_json::parse(v, nullptr, false);
        if (j.is_discarded()) j = std::string(v);
        Args(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), out);
      } else {
        if (!value_started_) {
          if (b.empty() && !final) return false;
          Args("\"", out);
          value_started_ = true;
          if (!b.empty() && b.front() == '\n') {  // the template's newline after the tag
            buf_.erase(0, 1);
            return true;
          }
        }
        if (end == std::string_view::npos && !final) {
          // Hold back what may be the start of the end tags, the newline the template writes
          // before </parameter>, and a cut UTF-8 character.
          size_t keep = PartialTagSuffix(b, {kParamEnd, kToolClose});
          if (keep < b.size() && b[b.size() - keep - 1] == '\n') ++keep;
          const size_t emit = Utf8Boundary(b.substr(0, b.size() - keep));
          Args(EscapeJson(b.substr(0, emit)), out);
          buf_.erase(0, emit);
          return false;
        }
        std::string_view v = b.substr(0, end);
        if (!v.empty() && v.back() == '\n') v.remove_suffix(1);
        Args(EscapeJson(v) + "\"", out);
      }
      if (end == pend && end != std::string_view::npos) {
        buf_.erase(0, end + kParamEnd.size());
        phase_ = Phase::kXmlBetween;
      } else {
        // </tool_call> or the end inside a value: close what was open.
        buf_.erase(0, end == std::string_view::npos ? b.size() : end);
        Args("}", out);
        phase_ = Phase::kTail;
      }
      return true;
    }
    case Phase::kJsonValue: {
      size_t i = 0;
      SkipWs(b, &i);
      if (i == b.size() && !final) return false;
      if (i < b.size() && b[i] == '{') {
        buf_.erase(0, i);
        depth_ = 0;
        in_string_ = escape_ = false;
        phase_ = Phase::kJsonObject;
        return true;
      }
      if (i < b.size() && b[i] == '"') {
        // Arguments as a JSON string holding the object: whole, when the string closes.
        const size_t e = StringEnd(b, i);
        if (e == std::string_view::npos && !final) return false;
        nlohmann::ordered_json args = nlohmann::ordered_json::object();
        if (e != std::string_view::npos) {
          const nlohmann::json str = nlohmann::json::parse(b.substr(i, e - i), nullptr, false);
          if (str.is_string()) {
            nlohmann::ordered_json a =
                nlohmann::ordered_json::parse(str.get<std::string>(), nullptr, false);
            if (a.is_object()) args = std::move(a);
          }
        }
        Args(args.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), out);
        buf_.erase(0, e == std::string_view::npos ? b.size() : e);
        phase_ = Phase::kTail;
        return true;
      }
      Args("{}", out);  // not an object: no arguments
      buf_.erase(0, i);
      phase_ = Phase::kTail;
      return true;
    }
    case Phase::kJsonObject: {
      // The object's text without the whitespace outside strings, up to its closing brace.
      std::string piece;
      size_t k = 0;
      bool done = false, cut = false;
      for (; k < b.size(); ++k) {
        const char ch = b[k];
        if (in_string_) {
          if (escape_) {
            escape_ = false;
          } else if (ch == '\\') {
            escape_ = true;
          } else if (ch == '"') {
            in_string_ = false;
          }
          piece += ch;
          continue;
        }
        if (IsWs(ch)) continue;
        if (ch == '<') {
          // </tool_call> before the object closed (a cut-off model): the arguments end.
          size_t at = k;
          const Match m = Literal(b, &at, kToolClose);
          if (m == Match::kMore && !final) break;
          if (m == Match::kYes) {
            cut = true;
            break;
          }
        }
        piece += ch;
        if (ch == '"') in_string_ = true;
        if (ch == '{' || ch == '[') ++depth_;
        if ((ch == '}' || ch == ']') && --depth_ == 0) {
          ++k;
          done = true;
          break;
        }
      }
      // A cut UTF-8 character waits for its other bytes.
      const size_t whole = final || done ? piece.size() : Utf8Boundary(piece);
      const size_t back = piece.size() - whole;
      Args(std::string_view(piece).substr(0, whole), out);
      buf_.erase(0, k - back);
      if (done || cut || final) {
        phase_ = Phase::kTail;
        return true;
      }
      return false;
    }
    case Phase::kTail: {
      // After the arguments: the text up to </tool_call> is not part of anything.
      if (close != std::string_view::npos) {
        buf_.erase(0, close + kToolClose.size());
        EndCall();
        return true;
      }
      if (final) {
        buf_.clear();
        EndCall();
        return true;
      }
      buf_.erase(0, b.size() - PartialTagSuffix(b, {kToolClose}));
      return false;
    }
  }
  return false;
}

}  // namespace ds
