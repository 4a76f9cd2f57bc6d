// Affinity keys of queued requests.
#include "api/affinity.h"

#include <string>

#include "base/hash.h"

namespace hr::api {
namespace {

// One field into the running hash, its length first so that field boundaries count.
uint64_t add(uint64_t h, std::string_view field) {
  h = fnv1a64(std::to_string(field.size()) + ":", h);
  return fnv1a64(field, h);
}

int64_t finish(uint64_t h) { return static_cast<int64_t>(mix64(h)); }

}  // namespace

int64_t prefix_affinity(const wire::ChatRequest& r) {
  uint64_t h = add(kFnv1aOffset, "prefix");
  size_t leading = 0;
  while (leading < r.messages.size() &&
         (r.messages[leading].role == "system" || r.messages[leading].role == "developer")) {
    h = add(add(h, r.messages[leading].role), r.messages[leading].content);
    ++leading;
  }
  for (const wire::Tool& t : r.tools) h = add(add(add(h, t.name), t.description), t.parameters);
  if (leading > 0 || !r.tools.empty()) return finish(h);
  // A bare prompt is sent as one user message.
  std::string_view role = "user";
  std::string_view first;
  if (r.prompt) {
    first = *r.prompt;
  } else if (!r.messages.empty()) {
    role = r.messages[0].role;
    first = r.messages[0].content;
  }
  return finish(add(add(h, role), first.substr(0, kAffinityPrefixBytes)));
}

int64_t session_affinity(std::string_view session) {
  return finish(add(add(kFnv1aOffset, "session"), session));
}

}  // namespace hr::api
