#include "gateway/http/openai_call.h"

#include "absl/strings/str_cat.h"
#include "common/log/log.h"
#include "gateway/status_map.h"

namespace ds::gw::http {

void CallRegistry::Add(Call* c) {
  std::lock_guard<std::mutex> l(mu_);
  calls_.insert(c);
}

void CallRegistry::Remove(Call* c) {
  std::lock_guard<std::mutex> l(mu_);
  calls_.erase(c);
}

void CallRegistry::CancelAll() {
  // Under mu_: a call cannot finish destroying itself (Remove) while it is cancelled here.
  std::lock_guard<std::mutex> l(mu_);
  for (Call* c : calls_) {
    c->gone.store(true);
    c->call->Cancel();
  }
}

absl::StatusCode PublicCode(const absl::Status& s) {
  return static_cast<absl::StatusCode>(ToPublicStatus(s).error_code());
}

Call::~Call() {
  if (registry) registry->Remove(this);
  if (watch) watcher->Remove(watch);
  // The response went away before the stream ran (client gone before the headers were
  // written): the scheduler still holds the request.
  if (call && !call_done) {
    call->Cancel();
    call->Finish().IgnoreError();
  }
  if (mr) Done(absl::CancelledError("client went away"));
}

absl::Status Call::FinishCall() {
  call_done = true;
  return call->Finish();
}

void Call::Done(const absl::Status& s) {
  if (logged) return;
  logged = true;
  const metrics::Outcome outcome = metrics::OutcomeFromStatus(PublicCode(s));
  if (mr) mr->Finish(outcome);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const log::Level level =
      s.ok() || s.code() == absl::StatusCode::kCancelled ? log::Level::kInfo : log::Level::kWarning;
  if (!log::Enabled(level)) return;
  log::Emit(level, "request_finished",
            {{"request_id", public_id.empty() ? std::string("-") : public_id},
             {"api", chat ? "openai.chat" : "openai.completions"},
             {"outcome", metrics::OutcomeName(outcome)},
             {"error", std::string(s.message())},
             {"prompt_tokens", static_cast<uint32_t>(prepared.prompt_ids.size())},
             {"completion_tokens", completion_tokens},
             {"duration_s", seconds},
             {"peer", peer}});
}

namespace {

// What the generation loop produces, in the API's terms; the writer turns it into SSE chunks or
// accumulates it for one JSON answer.
struct Delta {
  ParsedDelta parsed;  // chat: reasoning / content / tool calls; completions: content
  std::vector<TokenLogprob> logprobs;  // of the tokens behind this delta, when requested
};

class Writer {
 public:
  virtual ~Writer() = default;
  // false: the client is gone.
  virtual bool Write(Delta&& d) = 0;
};

// Runs the request to its end, starting with `first` when the handler already read it. Returns
// the request's final status (OK when it finished with stop or length).
absl::Status Pump(Call& c, Writer& w, const InternalEvent* first = nullptr) {
  SchedulerClient* sched = c.sched;
  auto deliver = [&](OutputChunk&& ch) -> bool {
    Delta d;
    if (c.req.logprobs) d.logprobs = std::move(ch.logprobs);
    if (c.parser)
      d.parsed = c.parser->Push(ch.text);
    else
      d.parsed.content = std::move(ch.text);
    if (d.parsed.empty() && d.logprobs.empty()) return true;
    return w.Write(std::move(d));
  };
  auto client_gone = [&]() {
    c.call->Cancel();
    c.FinishCall().IgnoreError();
    return absl::CancelledError("client went away");
  };
  // false: the client is gone.
  auto handle = [&](const InternalEvent& ev) -> bool {
    if (ev.kind == InternalEvent::Kind::kAdmitted) {
      if (c.mr)
        c.mr->Admitted(ev.queue_seconds, static_cast<uint32_t>(c.prepared.prompt_ids.size()));
    } else if (ev.kind == InternalEvent::Kind::kToken) {
      if (c.out->stopped()) return true;  // in flight when the stop string matched
      if (c.mr) c.mr->Token();
      ++c.completion_tokens;
      OutputChunk ch = c.out->Push(ev.token, ev.has_logprob ? &ev.logprob : nullptr);
      if (!deliver(std::move(ch)) || c.gone.load()) return false;
      if (c.out->stopped()) sched->Finish(c.id, FinishReason::kStop).IgnoreError();
    } else {
      c.finished = ev;
    }
    return true;
  };
  if (first && !handle(*first)) return client_gone();
  InternalEvent ev;
  while (!c.finished && c.call->Next(&ev))
    if (!handle(ev)) return client_gone();
  const absl::Status internal = c.FinishCall();
  if (c.gone.load()) return absl::CancelledError("client went away");
  if (!c.finished) {
    if (internal.ok())
      return absl::UnavailableError("scheduler ended the request without a result");
    const absl::Status explained = sched->Explain(internal);
    if (explained.code() == absl::StatusCode::kCancelled ||
        explained.code() == absl::StatusCode::kUnknown)
      return absl::UnavailableError(
          absl::StrCat("scheduler connection lost: ", explained.message()));
    return WithPublicRequestId(explained, c.id, c.public_id);
  }
  c.completion_tokens = c.out->n_tokens();
  if (c.out->stopped()) {
    c.reason = FinishReason::kStop;
  } else {
    c.reason = c.finished->reason;
    if (c.reason != FinishReason::kError) {
      OutputChunk tail = c.out->Finish();
      if (c.out->stopped()) c.reason = FinishReason::kStop;
      if (!deliver(std::move(tail))) return absl::CancelledError("client went away");
    }
  }
  if (c.parser) {
    Delta d;
    d.parsed = c.parser->Finish();
    if (!d.parsed.empty() && !w.Write(std::move(d)))
      return absl::CancelledError("client went away");
  }
  switch (c.reason) {
    case FinishReason::kError:
      if (!internal.ok()) return WithPublicRequestId(sched->Explain(internal), c.id, c.public_id);
      return absl::InternalError(c.finished->error);
    case FinishReason::kCancelled:
      return absl::DeadlineExceededError(c.finished->error.empty() ? "deadline exceeded"
                                                                   : c.finished->error);
    default:
      return absl::OkStatus();
  }
}

json ToolCallsJson(const std::vector<ToolCallDelta>& calls, bool with_index) {
  json out = json::array();
  for (const ToolCallDelta& t : calls) {
    json j = json::object();
    if (with_index) j["index"] = t.index;
    if (!t.id.empty()) {
      j["id"] = t.id;
      j["type"] = "function";
    }
    json fn = json::object();
    if (!t.name.empty()) fn["name"] = t.name;
    fn["arguments"] = t.arguments;
    j["function"] = std::move(fn);
    out.push_back(std::move(j));
  }
  return out;
}

// stream: false. Everything is collected, then answered once.
class CollectWriter : public Writer {
 public:
  explicit CollectWriter(const Call& c) : c_(c) {}
  bool Write(Delta&& d) override {
    reasoning_ += d.parsed.reasoning;
    content_ += d.parsed.content;
    // A call streams as fragments (the first with id and name): one entry per call here.
    for (auto& t : d.parsed.tool_calls) {
      if (!calls_.empty() && calls_.back().index == t.index)
        calls_.back().arguments += t.arguments;
      else
        calls_.push_back(std::move(t));
    }
    if (!d.logprobs.empty()) {
      if (c_.chat) {
        for (auto& e : ChatLogprobs(*c_.tok, d.logprobs, c_.req.top_logprobs))
          chat_lp_.push_back(std::move(e));
      } else {
        completion_lp_.Add(*c_.tok, d.logprobs, c_.req.top_logprobs, &offset_);
      }
    }
    return true;
  }

  json Body(int64_t created, const std::string& model) const {
    json choice = {{"index", 0}};
    const bool tools = !calls_.empty();
    if (c_.chat) {
      json msg = {{"role", "assistant"}};
      msg["content"] = content_.empty() && tools ? json(nullptr) : json(content_);
      if (!reasoning_.empty()) msg["reasoning_content"] = reasoning_;
      if (tools) msg["tool_calls"] = ToolCallsJson(calls_, /*with_index=*/false);
      choice["message"] = std::move(msg);
      choice["logprobs"] = c_.req.logprobs ? json{{"content", chat_lp_}} : json(nullptr);
    } else {
      choice["text"] = content_;
      choice["logprobs"] = c_.req.logprobs ? completion_lp_.ToJson() : json(nullptr);
    }
    choice["finish_reason"] = FinishReasonJson(c_.reason, tools);
    return json{{"id", c_.public_id},
                {"object", c_.object()},
                {"created", created},
                {"model", model},
                {"choices", json::array({choice})},
                {"usage", UsageJson(static_cast<uint32_t>(c_.prepared.prompt_ids.size()),
                                    c_.completion_tokens)}};
  }

 private:
  const Call& c_;
  std::string reasoning_, content_;
  std::vector<ToolCallDelta> calls_;
  json chat_lp_ = json::array();
  CompletionLogprobs completion_lp_;
  size_t offset_ = 0;
};

// stream: true. Each delta becomes one `chat.completion.chunk` / `text_completion` event.
class SseWriter : public Writer {
 public:
  SseWriter(Call& c, httplib::DataSink& sink, int64_t created, std::string model)
      : c_(c), sink_(sink), created_(created), model_(std::move(model)) {}

  bool Send(const std::string& s) {
    if (!sink_.write(s.data(), s.size())) {
      c_.gone.store(true);
      return false;
    }
    return true;
  }

  json Chunk(json choice) const {
    json j = {{"id", c_.public_id},
              {"object", c_.chat ? "chat.completion.chunk" : "text_completion"},
              {"created", created_},
              {"model", model_},
              {"choices", json::array({std::move(choice)})}};
    if (c_.req.include_usage) j["usage"] = nullptr;
    return j;
  }

  bool Start() {
    if (!c_.chat) return true;
    json choice = {{"index", 0},
                   {"delta", {{"role", "assistant"}, {"content", ""}}},
                   {"logprobs", nullptr},
                   {"finish_reason", nullptr}};
    return Send(SseEvent(Chunk(std::move(choice))));
  }

  bool Write(Delta&& d) override {
    any_tool_calls_ = any_tool_calls_ || !d.parsed.tool_calls.empty();
    json choice = {{"index", 0}};
    const Tokenizer& tok = *c_.tok;
    if (c_.chat) {
      json delta = json::object();
      if (!d.parsed.reasoning.empty()) delta["reasoning_content"] = d.parsed.reasoning;
      if (!d.parsed.content.empty()) delta["content"] = d.parsed.content;
      if (!d.parsed.tool_calls.empty())
        delta["tool_calls"] = ToolCallsJson(d.parsed.tool_calls, /*with_index=*/true);
      choice["delta"] = std::move(delta);
      choice["logprobs"] =
          d.logprobs.empty()
              ? json(nullptr)
              : json{{"content", ChatLogprobs(tok, d.logprobs, c_.req.top_logprobs)}};
    } else {
      choice["text"] = d.parsed.content;
      if (d.logprobs.empty()) {
        choice["logprobs"] = nullptr;
      } else {
        CompletionLogprobs lp;
        lp.Add(tok, d.logprobs, c_.req.top_logprobs, &offset_);
        choice["logprobs"] = lp.ToJson();
      }
    }
    choice["finish_reason"] = nullptr;
    return Send(SseEvent(Chunk(std::move(choice))));
  }

  void End(const absl::Status& s) {
    if (c_.gone.load()) return;
    if (s.ok()) {
      json choice = {{"index", 0}};
      if (c_.chat)
        choice["delta"] = json::object();
      else
        choice["text"] = "";
      choice["logprobs"] = nullptr;
      choice["finish_reason"] = FinishReasonJson(c_.reason, any_tool_calls_);
      if (!Send(SseEvent(Chunk(std::move(choice))))) return;
      if (c_.req.include_usage) {
        json u = Chunk(json());
        u["choices"] = json::array();
        u["usage"] =
            UsageJson(static_cast<uint32_t>(c_.prepared.prompt_ids.size()), c_.completion_tokens);
        if (!Send(SseEvent(u))) return;
      }
    } else {
      // After the 200 header an error can only travel in the stream (as OpenAI does).
      const grpc::Status pub = ToPublicStatus(s);
      if (!Send(SseEvent(ErrorJson(PublicCode(s), pub.error_message())))) return;
    }
    Send(std::string(kSseDone));
  }

 private:
  Call& c_;
  httplib::DataSink& sink_;
  int64_t created_;
  std::string model_;
  bool any_tool_calls_ = false;
  size_t offset_ = 0;
};

}  // namespace

absl::Status RunCollected(Call& c, int64_t created, const std::string& model, json* body) {
  CollectWriter w(c);
  const absl::Status s = Pump(c, w);
  if (s.ok()) *body = w.Body(created, model);
  return s;
}

absl::Status EndedBeforeStart(Call& c) {
  CollectWriter unused(c);
  return Pump(c, unused);
}

void RunStreamed(Call& c, httplib::DataSink& sink, int64_t created, const std::string& model,
                 const InternalEvent& first) {
  SseWriter w(c, sink, created, model);
  const absl::Status s = w.Start() ? Pump(c, w, &first) : absl::CancelledError("client went away");
  if (s.code() == absl::StatusCode::kCancelled) c.call->Cancel();
  w.End(s);
  c.Done(s);
}

}  // namespace ds::gw::http
