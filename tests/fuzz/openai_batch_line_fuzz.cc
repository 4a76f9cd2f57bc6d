// An OpenAI Batch API input file as the API validates it (api/batch_file.h): split into lines,
// the model picked, each line checked into what the queue stores, which must read back as a
// worker reads it.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "api/batch_file.h"
#include "wire/chat_request_json.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view content(reinterpret_cast<const char*>(data), size);
  const std::vector<hr::api::InputLine> lines = hr::api::split_jsonl(content);
  if (static_cast<int>(lines.size()) != hr::api::count_jsonl_lines(content)) std::abort();
  static const std::vector<hr::api::ModelSpec> models = {{"@hr/fuzz", 128}, {"gpt-fuzz", 4096}};
  hr::api::BatchLimits limits;
  hr::api::InputValidator validator(models, limits, "/v1/chat/completions");
  if (validator.pick_model(lines) == nullptr) return 0;
  std::vector<hr::api::LineError> errors;
  for (const auto& line : lines) {
    hr::queue::NewRequest out;
    if (auto e = validator.check(line, &out)) {
      errors.push_back(*e);
      continue;
    }
    auto back = hr::wire::parse_chat_request(out.body);
    if (!back.is_ok()) std::abort();
    if (hr::wire::to_json(*back) != nlohmann::json::parse(out.body)) std::abort();
  }
  (void)hr::api::errors_object(errors).dump();
  return 0;
}
