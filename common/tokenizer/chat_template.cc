#include "common/tokenizer/chat_template.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/tokenizer/py_format.h"

namespace ds {
namespace {

// The Qwen3.5 template's instructions after the tool list (its own text; the model was trained
// with exactly these bytes).
constexpr std::string_view kQwenToolInstructions =
    "\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n"
    "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n"
    "</parameter>\n<parameter=example_parameter_2>\nThis is the value for the second parameter\n"
    "that can span\nmultiple lines\n</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\n"
    "Reminder:\n- Function calls MUST follow the specified format: an inner <function=...>"
    "</function> block must be nested within <tool_call></tool_call> XML tags\n- Required "
    "parameters MUST be specified\n- You may provide optional reasoning for your function call in "
    "natural language BEFORE the function call, but NOT after\n- If there is no function call "
    "available, answer the question like normal with your current knowledge and do not tell the "
    "user about function calls\n</IMPORTANT>";

// Builds the prompt and remembers which bytes the template wrote.
class Out {
 public:
  void T(std::string_view s) {  // template text: special tokens allowed
    if (s.empty()) return;
    const size_t b = r_.text.size();
    r_.text.append(s);
    if (!r_.trusted.empty() && r_.trusted.back().second == b)
      r_.trusted.back().second = r_.text.size();
    else
      r_.trusted.emplace_back(b, r_.text.size());
  }
  void U(std::string_view s) { r_.text.append(s); }  // client text: never special
  RenderedPrompt& result() { return r_; }

 private:
  RenderedPrompt r_;
};

template <typename... P>
absl::Status Bad(const P&... p) {
  return absl::InvalidArgumentError(absl::StrCat(p...));
}

std::string Trimmed(const ChatTurn& m) { return std::string(py::Strip(m.content.value_or(""))); }

// Python's s.split(sep)[0] and s.split(sep)[-1].
std::string_view BeforeFirst(std::string_view s, std::string_view sep) {
  const size_t i = s.find(sep);
  return i == std::string_view::npos ? s : s.substr(0, i);
}
std::string_view AfterLast(std::string_view s, std::string_view sep) {
  const size_t i = s.rfind(sep);
  return i == std::string_view::npos ? s : s.substr(i + sep.size());
}

absl::StatusOr<RenderedPrompt> RenderQwen35(const std::vector<ChatTurn>& msgs,
                                            const ChatRenderOptions& opts, bool preserve_branch) {
  const bool preserve = preserve_branch && opts.preserve_thinking.value_or(false);
  if (msgs.empty()) return Bad("messages is empty: the prompt needs at least one message");
  Out o;
  const bool has_tools = opts.tools.is_array() && !opts.tools.empty();
  if (has_tools) {
    o.T("<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>");
    for (const auto& tool : opts.tools) {
      o.T("\n");
      o.U(py::JsonDumps(tool));
    }
    o.T("\n</tools>");
    o.T(kQwenToolInstructions);
    if (msgs[0].role == "system") {
      const std::string c = Trimmed(msgs[0]);
      if (!c.empty()) {
        o.T("\n\n");
        o.U(c);
      }
    }
    o.T("<|im_end|>\n");
  } else if (msgs[0].role == "system") {
    o.T("<|im_start|>system\n");
    o.U(Trimmed(msgs[0]));
    o.T("<|im_end|>\n");
  }

  // The last real user query (not a turn of tool responses): reasoning of assistant turns after
  // it is kept in the prompt, earlier reasoning is dropped.
  const int n = static_cast<int>(msgs.size());
  int last_query = n - 1;
  bool multi_step_tool = true;
  for (int i = n - 1; i >= 0 && multi_step_tool; --i) {
    if (msgs[i].role != "user") continue;
    const std::string c = Trimmed(msgs[i]);
    if (!(absl::StartsWith(c, "<tool_response>") && absl::EndsWith(c, "</tool_response>"))) {
      multi_step_tool = false;
      last_query = i;
    }
  }
  if (multi_step_tool)
    return Bad("messages: no user message (the chat template needs a user query)");

  for (int i = 0; i < n; ++i) {
    const ChatTurn& m = msgs[i];
    const std::string c = Trimmed(m);
    if (m.role == "system") {
      if (i != 0) return Bad("messages[", i, "]: a system message must be the first message");
    } else if (m.role == "user") {
      o.T("<|im_start|>user\n");
      o.U(c);
      o.T("<|im_end|>\n");
    } else if (m.role == "assistant") {
      std::string reasoning;
      std::string content = c;
      if (m.reasoning_content) {
        reasoning = *m.reasoning_content;
      } else if (absl::StrContains(c, "</think>")) {
        reasoning = std::string(py::LStripChars(
            AfterLast(py::RStripChars(BeforeFirst(c, "</think>"), "\n"), "<think>"), "\n"));
        content = std::string(py::LStripChars(AfterLast(c, "</think>"), "\n"));
      }
      reasoning = std::string(py::Strip(reasoning));
      // After the last query every assistant turn shows its (possibly empty) think block; with
      // Qwen3.6's preserve_thinking, every turn does.
      if (preserve || i > last_query) {
        o.T("<|im_start|>assistant\n<think>\n");
        o.U(reasoning);
        o.T("\n</think>\n\n");
        o.U(content);
      } else {
        o.T("<|im_start|>assistant\n");
        o.U(content);
      }
      for (size_t k = 0; k < m.tool_calls.size(); ++k) {
        const ChatToolCall& tc = m.tool_calls[k];
        if (k == 0)
          o.T(py::Strip(content).empty() ? "<tool_call>\n<function="
                                         : "\n\n<tool_call>\n<function=");
        else
          o.T("\n<tool_call>\n<function=");
        o.U(tc.name);
        o.T(">\n");
        if (!tc.arguments.is_object())
          return Bad("messages[", i, "].tool_calls[", k,
                     "].function.arguments is not a JSON object");
        for (const auto& [name, value] : tc.arguments.items()) {
          o.T("<parameter=");
          o.U(name);
          o.T(">\n");
          o.U(value.is_object() || value.is_array() ? py::JsonDumps(value) : py::Str(value));
          o.T("\n</parameter>\n");
        }
        o.T("</function>\n</tool_call>");
      }
      o.T("<|im_end|>\n");
    } else if (m.role == "tool") {
      if (i > 0 && msgs[i - 1].role != "tool") o.T("<|im_start|>user");
      o.T("\n<tool_response>\n");
      o.U(c);
      o.T("\n</tool_response>");
      if (i == n - 1 || msgs[i + 1].role != "tool") o.T("<|im_end|>\n");
    } else {
      return Bad("messages[", i, "].role '", m.role,
                 "' is not one of system, user, assistant, tool");
    }
  }
  RenderedPrompt& r = o.result();
  if (opts.add_generation_prompt) {
    o.T("<|im_start|>assistant\n");
    if (opts.enable_thinking.has_value() && !*opts.enable_thinking) {
      o.T("<think>\n\n</think>\n\n");
    } else {
      o.T("<think>\n");
      r.opens_reasoning = true;
    }
  }
  return std::move(r);
}

// The plain ChatML of FormatChatML (common/tokenizer/chat_format.h), with trusted ranges.
absl::StatusOr<RenderedPrompt> RenderChatML(const std::vector<ChatTurn>& msgs,
                                            const ChatRenderOptions& opts) {
  if (msgs.empty()) return Bad("messages is empty: the prompt needs at least one message");
  if (opts.tools.is_array() && !opts.tools.empty())
    return Bad(
        "tools: the model's chat template is plain ChatML (not a recognised tool-calling "
        "template), so tool definitions cannot be rendered");
  Out o;
  for (size_t i = 0; i < msgs.size(); ++i) {
    const ChatTurn& m = msgs[i];
    if (m.role == "system") {
      if (i != 0) return Bad("messages[", i, "]: a system message must be the first message");
    } else if (m.role != "user" && m.role != "assistant" && m.role != "tool") {
      return Bad("messages[", i, "].role '", m.role,
                 "' is not one of system, user, assistant, tool");
    }
    if (!m.tool_calls.empty())
      return Bad("messages[", i,
                 "].tool_calls: the model's chat template is plain ChatML and "
                 "cannot render tool calls");
    const std::string content = m.content.value_or("");
    if (m.role == "tool") {
      if (i == 0 || msgs[i - 1].role != "tool") o.T("<|im_start|>user");
      o.T("\n<tool_response>\n");
      o.U(content);
      o.T("\n</tool_response>");
      if (i + 1 == msgs.size() || msgs[i + 1].role != "tool") o.T("<|im_end|>\n");
      continue;
    }
    o.T(absl::StrCat("<|im_start|>", m.role, "\n"));
    o.U(content);
    o.T("<|im_end|>\n");
  }
  if (opts.add_generation_prompt) o.T("<|im_start|>assistant\n");
  return std::move(o.result());
}

}  // namespace

absl::StatusOr<std::vector<ChatTurn>> ChatTurnsFromJson(const nlohmann::ordered_json& messages) {
  if (!messages.is_array()) return Bad("messages must be an array");
  if (messages.empty()) return Bad("messages is empty: the prompt needs at least one message");
  std::vector<ChatTurn> turns;
  turns.reserve(messages.size());
  for (size_t i = 0; i < messages.size(); ++i) {
    const auto& m = messages[i];
    const std::string at = absl::StrCat("messages[", i, "]");
    if (!m.is_object()) return Bad(at, " must be an object");
    ChatTurn t;
    const auto role = m.find("role");
    if (role == m.end() || !role->is_string()) return Bad(at, ".role must be a string");
    t.role = role->get<std::string>();
    if (const auto c = m.find("content"); c != m.end() && !c->is_null()) {
      if (c->is_string()) {
        t.content = c->get<std::string>();
      } else if (c->is_array()) {
        std::string joined;
        for (size_t j = 0; j < c->size(); ++j) {
          const auto& part = (*c)[j];
          const auto text = part.is_object() ? part.find("text") : part.end();
          const auto type = part.is_object() ? part.find("type") : part.end();
          const bool is_text = part.is_object() && text != part.end() && text->is_string() &&
                               (type == part.end() || *type == "text");
          if (!is_text)
            return Bad(at, ".content[", j,
                       "] is not a text part ({\"type\": \"text\", \"text\": ...});",
                       " images and other media are not supported by this model");
          joined += text->get<std::string>();
        }
        t.content = std::move(joined);
      } else {
        return Bad(at, ".content must be a string, an array of text parts or null");
      }
    }
    if (const auto r = m.find("reasoning_content"); r != m.end() && !r->is_null()) {
      if (!r->is_string()) return Bad(at, ".reasoning_content must be a string");
      t.reasoning_content = r->get<std::string>();
    }
    if (const auto id = m.find("tool_call_id"); id != m.end() && id->is_string())
      t.tool_call_id = id->get<std::string>();
    if (const auto calls = m.find("tool_calls"); calls != m.end() && !calls->is_null()) {
      if (!calls->is_array()) return Bad(at, ".tool_calls must be an array");
      for (size_t k = 0; k < calls->size(); ++k) {
        const auto& call = (*calls)[k];
        const std::string cat = absl::StrCat(at, ".tool_calls[", k, "]");
        const auto fn = call.is_object() ? call.find("function") : call.end();
        if (!call.is_object() || fn == call.end() || !fn->is_object())
          return Bad(cat, ".function must be an object");
        ChatToolCall tc;
        if (const auto id = call.find("id"); id != call.end() && id->is_string())
          tc.id = id->get<std::string>();
        const auto name = fn->find("name");
        if (name == fn->end() || !name->is_string() || name->get<std::string>().empty())
          return Bad(cat, ".function.name must be a non-empty string");
        tc.name = name->get<std::string>();
        if (const auto args = fn->find("arguments"); args != fn->end() && !args->is_null()) {
          if (args->is_string()) {
            tc.arguments = nlohmann::ordered_json::parse(args->get<std::string>(), nullptr,
                                                         /*allow_exceptions=*/false);
          } else {
            tc.arguments = *args;
          }
          if (!tc.arguments.is_object())
            return Bad(cat, ".function.arguments is not a JSON object");
        }
        t.tool_calls.push_back(std::move(tc));
      }
    }
    turns.push_back(std::move(t));
  }
  return turns;
}

ChatTemplate ChatTemplate::FromJinja(std::string_view jinja) {
  // The Qwen3.5/3.6 family: XML tool calls with the example block, thinking switch and the
  // multi-step tool scan. All four markers must be present (a Qwen3 JSON-tool-call template
  // lacks the first).
  auto has = [&](std::string_view m) { return jinja.find(m) != std::string_view::npos; };
  if (has("<function=example_function_name>") && has("<tool_response>") && has("enable_thinking") &&
      has("last_query_index") && has("<|im_start|>"))
    return Of(ChatTemplateKind::kQwen35,
              has("preserve_thinking is defined and preserve_thinking is true"));
  return ChatTemplate(ChatTemplateKind::kChatML);
}

const char* ChatTemplate::name() const {
  return kind_ == ChatTemplateKind::kQwen35 ? "qwen3.5" : "chatml";
}

absl::StatusOr<RenderedPrompt> ChatTemplate::Render(const std::vector<ChatTurn>& messages,
                                                    const ChatRenderOptions& opts) const {
  if (kind_ == ChatTemplateKind::kQwen35) return RenderQwen35(messages, opts, preserve_branch_);
  return RenderChatML(messages, opts);
}

}  // namespace ds
