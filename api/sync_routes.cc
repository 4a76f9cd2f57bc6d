// The sync routes: POST /ai/run/{model} (Workers AI's shape; queued when asked, see
// async_routes.cc), POST /v1/chat/completions (OpenAI's), each streamed as server-sent events with
// `stream: true`, and GET /v1/models. The answers' shapes come from wire/.
#include <optional>
#include <set>
#include <string>
#include <utility>

#include "api/internal/api_impl.h"
#include "api/token_estimate.h"
#include "base/clock.h"
#include "base/ids.h"
#include "wire/json_text.h"
#include "wire/openai_chat.h"
#include "wire/workers_ai.h"

namespace hr::api {

namespace beast_http = boost::beast::http;

namespace {

// Retry-After in seconds, when a limit said when (else the error's own, if any).
void set_retry_after(http::HttpResponse& res, int seconds) {
  if (seconds > 0) res.set(beast_http::field::retry_after, std::to_string(seconds));
}

int64_t tokens_of(const wire::Usage& u) { return u.prompt_tokens + u.completion_tokens; }

// Names the worker that answered a sync call (x-headroom-worker), when it was a remote one.
void mark_worker(http::HttpResponse& res, const std::string& worker) {
  if (!worker.empty()) res.set("x-headroom-worker", worker);
}

// The sync routes' own fields, checked before they are read: flags are booleans (or null), the
// option groups objects, and n (OpenAI's number of choices) one.
// A call's tier: OpenAI's service_tier (options.service_tier for Workers AI; options' wins) and a
// flex call's own timeout, flex_timeout_s, beside it. The one reader of both, for the checks,
// the call and the answer's echo.
struct ServiceTier {
  bool flex = false;
  std::optional<int> timeout_ms;
};
Result<ServiceTier> service_tier_of(const json& body) {
  ServiceTier tier;
  const json* options =
      body.contains("options") && body["options"].is_object() ? &body["options"] : nullptr;
  for (const auto& [obj, prefix] :
       {std::pair<const json*, std::string>{&body, ""}, {options, "options."}}) {
    if (obj == nullptr) continue;
    if (auto t = obj->find("service_tier"); t != obj->end() && !t->is_null()) {
      static const std::set<std::string> kTiers = {"auto", "default", "flex"};
      if (!t->is_string() || !kTiers.count(t->get<std::string>())) {
        return invalid_argument("'" + prefix + "service_tier' must be auto, default or flex",
                                prefix + "service_tier");
      }
      tier.flex = t->get<std::string>() == "flex";
    }
    if (auto s = obj->find("flex_timeout_s"); s != obj->end() && !s->is_null()) {
      if (!s->is_number() || s->get<double>() < 0.001 || s->get<double>() > 86400) {
        return invalid_argument(
            "'" + prefix + "flex_timeout_s' must be a number of seconds, up to 86400",
            prefix + "flex_timeout_s");
      }
      tier.timeout_ms = std::max(1, static_cast<int>(s->get<double>() * 1000));
    }
  }
  return tier;
}

// Whether a checked body asks for the flex tier (for the answer's echo).
bool is_flex(const json& body) {
  Result<ServiceTier> tier = service_tier_of(body);
  return tier.is_ok() && tier->flex;
}

Status check_sync_fields(const json& body) {
  auto check_flag = [](const json& obj, const char* key, const std::string& field) -> Status {
    auto it = obj.find(key);
    if (it != obj.end() && !it->is_null() && !it->is_boolean()) {
      return invalid_argument("'" + field + "' must be true or false", field);
    }
    return Status::ok();
  };
  HR_RETURN_IF_ERROR(check_flag(body, "stream", "stream"));
  for (const char* group : {"options", "stream_options"}) {
    auto it = body.find(group);
    if (it != body.end() && !it->is_null() && !it->is_object()) {
      return invalid_argument(std::string("'") + group + "' must be an object", group);
    }
  }
  if (auto o = body.find("options"); o != body.end() && o->is_object()) {
    HR_RETURN_IF_ERROR(check_flag(*o, "rejectIfBusy", "options.rejectIfBusy"));
  }
  if (auto o = body.find("stream_options"); o != body.end() && o->is_object()) {
    HR_RETURN_IF_ERROR(check_flag(*o, "include_usage", "stream_options.include_usage"));
  }
  if (auto n = body.find("n");
      n != body.end() && !n->is_null() && !(n->is_number_integer() && n->get<int64_t>() == 1)) {
    return invalid_argument("'n' must be 1: one choice per request is served", "n");
  }
  HR_RETURN_IF_ERROR(service_tier_of(body).status());
  return Status::ok();
}

// An answer without the log probabilities its request asked for: from a worker of an earlier
// release, which ignores logprobs (every answer of this one carries them, empty or not).
Status no_logprobs_from_worker() {
  return unavailable(
      "the worker that answered does not serve log probabilities (an earlier release)");
}

// Whether a /ai/run call asks to be queued: ?queueRequest=true, "queueRequest": true or
// "options": {"queueRequest": true} (the last one said wins).
bool queue_requested(const json& body, const std::map<std::string, std::string>& query) {
  bool queued = query.count("queueRequest") && query.at("queueRequest") == "true";
  if (body.contains("queueRequest")) queued = body["queueRequest"] == true;
  if (body.contains("options") && body["options"].is_object() &&
      body["options"].contains("queueRequest")) {
    queued = body["options"]["queueRequest"] == true;
  }
  return queued;
}

}  // namespace

// obj[key] as a flag: absent, null or not a boolean is false (check_sync_fields refuses the last).
bool flag(const json& obj, const char* key) {
  if (!obj.is_object()) return false;
  auto it = obj.find(key);
  return it != obj.end() && it->is_boolean() && it->get<bool>();
}

http::HttpResponse Api::Impl::run_model(const http::HttpRequest& req, const std::string& account,
                                        const std::string& model_name,
                                        const std::map<std::string, std::string>& query,
                                        http::BodyStream* stream) {
  int64_t t0 = steady_now_ns();
  std::string why;
  json body = wire::parse_client_json(req.body(), &why);
  parse_ns_ = steady_now_ns() - t0;
  if (body.is_discarded()) return error_response(invalid_argument("body " + why, "body"));
  if (!body.is_object())
    return error_response(invalid_argument("body must be a JSON object", "body"));
  if (body.contains("request_id")) {
    if (!body["request_id"].is_string()) {
      return error_response(invalid_argument("'request_id' must be a string", "request_id"));
    }
    return poll(account, body["request_id"], query, stream);
  }
  const ModelSpec* model = find_model(model_name);
  if (model == nullptr) {
    return error_response(invalid_argument("unknown model '" + model_name + "'", "model"));
  }
  if (queue_requested(body, query)) return submit(req, account, *model, body);
  if (Status st = check_sync_fields(body); !st.is_ok()) return error_response(st);
  if (body.contains("stream") && body["stream"] == true && stream != nullptr) {
    http::Reply r = run_model_stream(req, account, std::move(body), *model);
    *stream = std::move(r.stream);
    return std::move(r.response);
  }
  json request = body;
  request.erase("queueRequest");
  int retry_after_s = 0;
  Result<SyncAnswer> answer = run_sync(req, account, request, *model, &retry_after_s);
  if (!answer.is_ok()) {
    http::HttpResponse res = error_response(answer.status());
    set_retry_after(res, retry_after_s);
    return res;
  }
  json result = wire::workers_ai_result(answer->answer, false);
  if (is_flex(body)) result["service_tier"] = "flex";
  http::HttpResponse res = ok_response(std::move(result));
  mark_worker(res, answer->worker);
  return res;
}

SyncCall Api::Impl::sync_call(const http::HttpRequest& req, const std::string& account,
                              const json& body, const ModelSpec& model) const {
  SyncCall call;
  call.model = model.name;
  call.cache_namespace = account;
  call.reject_if_busy = body.contains("options") && flag(body["options"], "rejectIfBusy");
  call.queue_timeout_ms = config.sync_queue_timeout_ms;
  auto it = req.find("x-session-affinity");
  if (it != req.end()) call.affinity = std::string(it->value());
  call.client_gone = http::current_client_gone;
  // The tier and timeout as check_sync_fields let them through.
  if (Result<ServiceTier> tier = service_tier_of(body); tier.is_ok()) {
    call.flex = tier->flex;
    call.flex_timeout_ms = tier->timeout_ms.value_or(config.flex_timeout_ms);
  }
  return call;
}

Result<SyncInference*> Api::Impl::sync_for(const ModelSpec& model) const {
  pool->release();  // the caller waits on the inference next: it needs no database meanwhile
  SyncInference* s = sync.load();
  if (s == nullptr) {
    return Status(StatusCode::kResourceExhausted,
                  "Out of capacity: no worker is serving " + model.name + " here");
  }
  return s;
}

std::variant<SyncPermit, http::HttpResponse> Api::Impl::admit_sync(const std::string& account,
                                                                   const wire::ChatRequest& request,
                                                                   ErrorShape shape) {
  auto admitted = sync_limits->admit(account, estimate_request_tokens(request));
  if (auto* permit = std::get_if<SyncPermit>(&admitted)) return std::move(*permit);
  const SyncRefusal& refusal = std::get<SyncRefusal>(admitted);
  http::HttpResponse res = shaped_error(refusal.status, shape);
  set_retry_after(res, refusal.retry_after_s);
  return res;
}

Result<SyncAnswer> Api::Impl::run_sync(const http::HttpRequest& req, const std::string& account,
                                       const json& body, const ModelSpec& model,
                                       int* retry_after_s) {
  SyncCall call = sync_call(req, account, body, model);
  json request = body;
  for (const char* key : {"options", "service_tier", "flex_timeout_s"}) request.erase(key);
  if (request.contains("stream") && request["stream"] == true) {
    return invalid_argument("stream: true needs a streaming connection; send stream: false",
                            "stream");
  }
  request.erase("stream");
  HR_ASSIGN_OR_RETURN(
      wire::ChatRequest norm,
      normalize_chat_request(request, model, limits, ordered_schemas(req.body()).get()));
  auto admitted = sync_limits->admit(account, estimate_request_tokens(norm));
  if (auto* refused = std::get_if<SyncRefusal>(&admitted)) {
    *retry_after_s = refused->retry_after_s;
    return refused->status;
  }
  SyncPermit permit = std::move(std::get<SyncPermit>(admitted));
  HR_ASSIGN_OR_RETURN(SyncInference * s, sync_for(model));
  HR_ASSIGN_OR_RETURN(SyncAnswer answer, s->run(norm, call));
  permit.settle(tokens_of(answer.answer.usage));
  answer.answer.json = wire::answers_json(norm);
  // A worker of an earlier release ignores logprobs: its answer must not pass for one with them.
  if (norm.logprobs && !answer.answer.logprobs) return no_logprobs_from_worker();
  return answer;
}

http::HttpResponse Api::Impl::chat_completions(const http::HttpRequest& req,
                                               const std::string& account) {
  std::string why;
  json body = wire::parse_client_json(req.body(), &why);
  if (body.is_discarded()) return openai_error_response(invalid_argument("body " + why, "body"));
  if (!body.is_object())
    return openai_error_response(invalid_argument("body is not a JSON object", "body"));
  if (Status st = check_sync_fields(body); !st.is_ok()) return openai_error_response(st);
  if (!body.contains("model") || !body["model"].is_string()) {
    return openai_error_response(invalid_argument("'model' is required", "model"));
  }
  const ModelSpec* model = find_model(body["model"]);
  if (model == nullptr) {
    return openai_error_response(
        invalid_argument("unknown model '" + body["model"].get<std::string>() + "'", "model"));
  }
  // OpenAI fields this server does not use but clients commonly send.
  for (const char* key : {"n", "user", "stream_options"}) body.erase(key);
  int retry_after_s = 0;
  Result<SyncAnswer> a = run_sync(req, account, body, *model, &retry_after_s);
  if (!a.is_ok()) {
    http::HttpResponse res = openai_error_response(a.status());
    set_retry_after(res, retry_after_s);
    return res;
  }
  json completion =
      wire::chat_completion(a->answer, "chatcmpl-" + new_uuid_v4().to_string(),
                            SystemClock::instance().now_unix_ms() / 1000, model->name);
  completion["service_tier"] = is_flex(body) ? "flex" : "default";
  http::HttpResponse res = http::json_response(200, completion.dump());
  mark_worker(res, a->worker);
  return res;
}

// OpenAI chat.completion.chunk events over SSE, ending with data: [DONE].
http::Reply Api::Impl::chat_completions_stream(const http::HttpRequest& req,
                                               const std::string& account, json body) {
  if (!body.contains("model") || !body["model"].is_string()) {
    return {openai_error_response(invalid_argument("'model' is required", "model")), nullptr};
  }
  const ModelSpec* model = find_model(body["model"]);
  if (model == nullptr) {
    return {openai_error_response(invalid_argument(
                "unknown model '" + body["model"].get<std::string>() + "'", "model")),
            nullptr};
  }
  if (Status st = check_sync_fields(body); !st.is_ok()) return {openai_error_response(st), nullptr};
  bool include_usage =
      body.contains("stream_options") && flag(body["stream_options"], "include_usage");
  SyncCall call = sync_call(req, account, body, *model);
  for (const char* key :
       {"n", "user", "stream_options", "stream", "options", "service_tier", "flex_timeout_s"}) {
    body.erase(key);
  }
  Result<wire::ChatRequest> norm =
      normalize_chat_request(body, *model, limits, ordered_schemas(req.body()).get());
  if (!norm.is_ok()) return {openai_error_response(norm.status()), nullptr};
  auto admitted = admit_sync(account, *norm, ErrorShape::kOpenAi);
  if (auto* refused = std::get_if<http::HttpResponse>(&admitted))
    return {std::move(*refused), nullptr};
  Result<SyncInference*> s = sync_for(*model);
  if (!s.is_ok()) return {openai_error_response(s.status()), nullptr};
  Result<std::unique_ptr<wire::AnswerStream>> started = (*s)->start_stream(*norm, call);
  if (!started.is_ok()) return {openai_error_response(started.status()), nullptr};
  struct State {
    std::unique_ptr<wire::AnswerStream> stream;
    std::string id = "chatcmpl-" + new_uuid_v4().to_string();
    int64_t created = SystemClock::instance().now_unix_ms() / 1000;
    std::string model;
    bool include_usage = false;
    std::string service_tier;  // echoed in every chunk
    bool logprobs = false;     // asked for
    int phase = 0;             // 0: role, 1: deltas, 2: usage, 3: done
    int streamed_calls = 0;    // tool calls that went out piece by piece
    SyncPermit permit;         // the call's place under the account's limits, until it ends
  };
  auto st = std::make_shared<State>();
  st->permit = std::move(std::get<SyncPermit>(admitted));
  st->logprobs = norm->logprobs;
  st->stream = std::move(started).value();
  st->model = model->name;
  st->include_usage = include_usage;
  st->service_tier = call.flex ? "flex" : "default";
  auto event = [st](json delta, json finish_reason, json usage, json logprobs = nullptr) {
    return wire::chat_chunk_event(st->id, st->created, st->model, std::move(delta),
                                  std::move(finish_reason), std::move(usage), std::move(logprobs),
                                  st->service_tier);
  };
  http::Reply reply;
  reply.response = http::json_response(200, "");
  reply.response.set(beast_http::field::content_type, "text/event-stream");
  reply.response.set(beast_http::field::cache_control, "no-cache");
  mark_worker(reply.response, st->stream->worker());
  reply.stream = [st, event](std::string* out) -> bool {
    switch (st->phase) {
      case 0:
        st->phase = 1;
        *out = event({{"role", "assistant"}, {"content", ""}}, nullptr, nullptr);
        return true;
      case 1: {
        std::string delta;
        if (st->stream->next(&delta)) {
          const wire::Logprobs& lp = st->stream->delta_logprobs();
          if (st->logprobs && !lp) {
            *out = "data: " + openai_error_body(no_logprobs_from_worker()).dump() +
                   "\n\ndata: [DONE]\n\n";
            st->phase = 3;
            st->stream.reset();  // the generation stops
            return true;
          }
          const std::vector<wire::ToolCallDelta>& calls = st->stream->delta_tool_calls();
          out->clear();
          if (!delta.empty() || calls.empty() || lp)
            *out = event({{"content", delta}}, nullptr, nullptr, wire::logprobs_object(lp));
          for (const wire::ToolCallDelta& c : calls) {
            json piece = {{"index", c.index}};
            if (!c.id.empty()) {
              piece["id"] = c.id;
              piece["type"] = "function";
              piece["function"] = {{"name", c.name}, {"arguments", c.arguments}};
            } else {
              piece["function"] = {{"arguments", c.arguments}};
            }
            *out += event({{"tool_calls", json::array({piece})}}, nullptr, nullptr);
            st->streamed_calls = std::max(st->streamed_calls, c.index + 1);
          }
          return true;
        }
        st->phase = 2;
        if (!st->stream->status().is_ok()) {
          *out = "data: " + openai_error_body(st->stream->status()).dump() + "\n\n";
          st->phase = 3;
          *out += "data: [DONE]\n\n";
          return true;
        }
        st->permit.settle(tokens_of(st->stream->answer().usage));
        // The calls not streamed piece by piece, each as one chunk with its id and name and one
        // with its arguments, then the finish reason.
        out->clear();
        const std::vector<wire::ToolCall>& calls = st->stream->answer().tool_calls;
        for (size_t i = static_cast<size_t>(st->streamed_calls); i < calls.size(); ++i) {
          const json head = {{"index", i},
                             {"id", calls[i].id},
                             {"type", "function"},
                             {"function", {{"name", calls[i].name}, {"arguments", ""}}}};
          const json args = {{"index", i}, {"function", {{"arguments", calls[i].arguments}}}};
          *out += event({{"tool_calls", json::array({head})}}, nullptr, nullptr);
          *out += event({{"tool_calls", json::array({args})}}, nullptr, nullptr);
        }
        *out += event(json::object(), st->stream->answer().finish_reason, nullptr);
        return true;
      }
      case 2: {
        st->phase = 3;
        if (st->include_usage) {
          *out = event(nullptr, nullptr, wire::usage_json(st->stream->answer().usage));
        }
        *out += "data: [DONE]\n\n";
        return true;
      }
      default:
        return false;
    }
  };
  return reply;
}

// Server-sent events in Workers AI's shape: data: {"response": "<delta>"} per piece, then
// data: {"response": "", "usage": {...}, "finish_reason": ...}, then data: [DONE].
http::Reply Api::Impl::run_model_stream(const http::HttpRequest& req, const std::string& account,
                                        json body, const ModelSpec& model) {
  SyncCall call = sync_call(req, account, body, model);
  for (const char* key : {"stream", "options", "queueRequest", "service_tier", "flex_timeout_s"})
    body.erase(key);
  Result<wire::ChatRequest> norm =
      normalize_chat_request(body, model, limits, ordered_schemas(req.body()).get());
  if (!norm.is_ok()) return {error_response(norm.status()), nullptr};
  auto admitted = admit_sync(account, *norm, ErrorShape::kWorkersAi);
  if (auto* refused = std::get_if<http::HttpResponse>(&admitted))
    return {std::move(*refused), nullptr};
  Result<SyncInference*> s = sync_for(model);
  if (!s.is_ok()) return {error_response(s.status()), nullptr};
  Result<std::unique_ptr<wire::AnswerStream>> started = (*s)->start_stream(*norm, call);
  if (!started.is_ok()) return {error_response(started.status()), nullptr};
  struct State {
    std::unique_ptr<wire::AnswerStream> stream;
    bool logprobs = false;  // asked for
    bool done = false;
    SyncPermit permit;  // the call's place under the account's limits, until it ends
  };
  auto st = std::make_shared<State>();
  st->permit = std::move(std::get<SyncPermit>(admitted));
  st->stream = std::move(started).value();
  st->logprobs = norm->logprobs;
  http::Reply reply;
  reply.response = http::json_response(200, "");
  reply.response.set(beast_http::field::content_type, "text/event-stream");
  reply.response.set(beast_http::field::cache_control, "no-cache");
  mark_worker(reply.response, st->stream->worker());
  reply.stream = [st](std::string* out) -> bool {
    if (st->done) return false;
    std::string delta;
    if (st->stream->next(&delta)) {
      const wire::Logprobs& lp = st->stream->delta_logprobs();
      if (st->logprobs && !lp) {
        *out = "data: " + error_body(no_logprobs_from_worker()).dump() + "\n\ndata: [DONE]\n\n";
        st->done = true;
        st->stream.reset();  // the generation stops
        return true;
      }
      // A piece with only tool-call parts has nothing for Workers AI (its calls come in the
      // last event).
      out->clear();
      if (!delta.empty() || lp || st->stream->delta_tool_calls().empty())
        *out = wire::workers_ai_delta_event(delta, lp);
      return true;
    }
    st->done = true;
    if (!st->stream->status().is_ok()) {
      *out = "data: " + error_body(st->stream->status()).dump() + "\n\n";
    } else {
      st->permit.settle(tokens_of(st->stream->answer().usage));
      *out = wire::workers_ai_final_event(st->stream->answer());
    }
    *out += "data: [DONE]\n\n";
    return true;
  };
  return reply;
}

http::HttpResponse Api::Impl::models_list() {
  json data = json::array();
  for (const auto& m : models) {
    data.push_back({{"id", m.name},
                    {"object", "model"},
                    {"created", 0},
                    {"owned_by", "headroom"},
                    {"context_length", m.context_length}});
  }
  return http::json_response(200, json{{"object", "list"}, {"data", data}}.dump());
}

}  // namespace hr::api
