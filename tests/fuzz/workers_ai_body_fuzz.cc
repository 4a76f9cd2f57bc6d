// The Workers-AI submit body as the API validates it (api/async_routes.cc): the JSON text, the
// batch envelope, the priority, and each request normalized into what the queue stores. A request
// that passes must read back (wire/chat_request_json.h) as the same JSON, as a worker reads it.
#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <unordered_set>

#include "api/batch_request.h"
#include "wire/chat_request_json.h"
#include "wire/json_text.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using nlohmann::json;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const json body = hr::wire::parse_client_json(text);
  if (body.is_discarded() || !body.is_object()) return 0;
  const hr::api::ModelSpec model{"@hr/fuzz", 128};
  hr::api::BatchLimits limits;
  limits.max_requests = 64;
  (void)hr::api::batch_priority(
      {{&body, ""}, {body.contains("options") ? &body.at("options") : nullptr, "options."}});
  const auto ordered = hr::api::ordered_schemas(text);
  std::vector<hr::queue::NewRequest> stored;
  if (body.contains("requests")) {
    if (hr::api::check_batch_envelope(body, limits)) return 0;
    const nlohmann::ordered_json* ordered_reqs =
        ordered && ordered->is_object() && ordered->contains("requests") ? &(*ordered)["requests"]
                                                                         : nullptr;
    std::unordered_set<std::string> seen;
    for (size_t i = 0; i < body["requests"].size(); ++i) {
      hr::queue::NewRequest out;
      if (hr::api::parse_batch_request(body["requests"], i, model, limits, &seen, &out,
                                       ordered_reqs)) {
        return 0;
      }
      stored.push_back(std::move(out));
    }
  } else {
    auto r = hr::api::normalize_chat_request(body, model, limits, ordered.get());
    if (!r.is_ok()) return 0;
    stored.push_back({std::nullopt, hr::wire::to_json(*r).dump()});
  }
  for (const auto& s : stored) {
    auto back = hr::wire::parse_chat_request(s.body);
    if (!back.is_ok()) std::abort();  // stored, but a worker could not read it
    if (hr::wire::to_json(*back) != json::parse(s.body)) std::abort();  // read back differently
  }
  return 0;
}
