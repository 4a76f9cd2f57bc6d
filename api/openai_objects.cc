// OpenAI objects.
#include "api/openai_objects.h"

namespace hr::api {
namespace {

using json = nlohmann::ordered_json;

json seconds(const std::optional<int64_t>& ms) { return ms ? json(*ms / 1000) : json(nullptr); }

json parsed(const std::optional<std::string>& text) {
  if (!text) return nullptr;
  json j = json::parse(*text, nullptr, false);
  return j.is_discarded() ? json(nullptr) : j;
}

json optional_string(const std::optional<std::string>& s) { return s ? json(*s) : json(nullptr); }

// The stored errors list in OpenAI's field order (jsonb keeps its own).
json errors_list(const std::optional<std::string>& text) {
  json stored = parsed(text);
  if (!stored.is_object() || !stored.contains("data") || !stored["data"].is_array()) return stored;
  json data = json::array();
  for (const json& e : stored["data"]) {
    data.push_back({{"code", e.value("code", json())},
                    {"message", e.value("message", json())},
                    {"param", e.value("param", json())},
                    {"line", e.value("line", json())}});
  }
  return {{"object", "list"}, {"data", std::move(data)}};
}

}  // namespace

json file_object(const queue::FileInfo& file) {
  return {{"id", file.id},
          {"object", "file"},
          {"bytes", file.bytes},
          {"created_at", file.created_at_ms / 1000},
          {"expires_at", file.expires_at_ms / 1000},
          {"filename", file.filename},
          {"purpose", file.purpose},
          {"status", "processed"},
          {"status_details", nullptr}};
}

std::string openai_batch_status(const queue::OpenAiBatch& b) {
  const std::string& s = b.info.status;
  if (s == "failed" && b.errors_json) return "failed";
  if (!b.info.finished_at_ms) return b.info.cancel_requested ? "cancelling" : "in_progress";
  if (!b.finalized_at_ms) return s == "cancelled" ? "cancelling" : "finalizing";
  if (s == "cancelled") return "cancelled";
  if (s == "expired") return "expired";
  return "completed";
}

json batch_object(const queue::OpenAiBatch& b) {
  std::string status = openai_batch_status(b);
  const queue::BatchInfo& info = b.info;
  bool validation_failed = status == "failed";
  std::optional<int64_t> created = info.created_at_ms;
  auto at_if = [&](bool cond, const std::optional<int64_t>& ms) {
    return cond ? seconds(ms) : json(nullptr);
  };
  bool cancelled_path = info.status == "cancelled";
  return {{"id", info.id},
          {"object", "batch"},
          {"endpoint", optional_string(b.endpoint)},
          {"model", info.model},
          {"errors", errors_list(b.errors_json)},
          {"input_file_id", optional_string(b.input_file_id)},
          {"completion_window", optional_string(b.completion_window)},
          {"status", status},
          {"output_file_id", optional_string(b.output_file_id)},
          {"error_file_id", optional_string(b.error_file_id)},
          {"created_at", info.created_at_ms / 1000},
          {"in_progress_at", at_if(!validation_failed, created)},
          {"expires_at", seconds(info.deadline_ms)},
          {"finalizing_at", at_if(!validation_failed && !cancelled_path, info.finished_at_ms)},
          {"completed_at", at_if(status == "completed", b.finalized_at_ms)},
          {"failed_at", at_if(validation_failed, created)},
          {"expired_at", at_if(status == "expired", b.finalized_at_ms)},
          {"cancelling_at", seconds(b.cancel_requested_at_ms)},
          {"cancelled_at", at_if(status == "cancelled", b.finalized_at_ms)},
          {"request_counts",
           {{"total", info.num_total},
            {"completed", info.num_completed},
            {"failed", info.num_failed + info.num_cancelled + info.num_expired}}},
          {"usage",
           {{"input_tokens", info.prompt_tokens},
            {"input_tokens_details", {{"cached_tokens", info.cached_tokens}}},
            {"output_tokens", info.completion_tokens},
            {"output_tokens_details", {{"reasoning_tokens", 0}}},
            {"total_tokens", info.prompt_tokens + info.completion_tokens}}},
          {"metadata", parsed(b.metadata_json)},
          // Extensions: when the batch's data goes (its expires_at is OpenAI's: the window's
          // end), the retries linking batches (docs/retention.md) and the priority among the
          // account's batches (docs/fair-share.md).
          {"data_expires_at", info.expires_at_ms / 1000},
          {"retried_from", optional_string(info.retried_from)},
          {"priority", info.priority},
          {"retries", info.retries}};
}

}  // namespace hr::api
