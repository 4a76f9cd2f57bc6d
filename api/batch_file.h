// Validation of an OpenAI Batch API input file: JSONL, one request per line,
//   {"custom_id": "...", "method": "POST", "url": "/v1/chat/completions", "body": {...}}.
// Each line is checked on its own (JSON, custom_id present and unique, method, url equal to the
// batch's endpoint, body.model served and the same on every line, the body's shape) and turned into
// a store request. Errors carry OpenAI's fields: code, message, param and the 1-based line number.
// Pure functions and a single-threaded validator.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "api/batch_request.h"
#include "queue/store.h"

namespace hr::api {

struct InputLine {
  int line = 0;  // 1-based line number in the file
  std::string_view text;
};

// The non-blank lines of `content` (a trailing '\r' is dropped), with their line numbers.
std::vector<InputLine> split_jsonl(std::string_view content);
// How many non-blank lines `content` has (what split_jsonl would return, without building it).
int count_jsonl_lines(std::string_view content);

struct LineError {
  std::string code;  // e.g. invalid_json_line, duplicate_custom_id, model_not_found
  std::string message;
  std::string param;  // the field at fault, e.g. "custom_id", "body.messages[0].role"; may be empty
  std::optional<int> line;
};

// {"object": "list", "data": [{"code", "message", "param", "line"}, ...]}
nlohmann::json errors_object(const std::vector<LineError>& errors);

class InputValidator {
 public:
  InputValidator(const std::vector<ModelSpec>& models, const BatchLimits& limits,
                 std::string endpoint);

  // The model named by the first line whose body.model is a served model; nullptr when no line
  // has one. Every line must then name the same model.
  const ModelSpec* pick_model(const std::vector<InputLine>& lines);
  // Checks one line against the batch (call in line order: custom_ids are remembered) and fills
  // `out` with its custom_id and normalized body.
  std::optional<LineError> check(const InputLine& line, queue::NewRequest* out);

 private:
  const std::vector<ModelSpec>& models_;
  BatchLimits limits_;
  std::string endpoint_;
  const ModelSpec* model_ = nullptr;
  std::unordered_map<std::string, int> seen_;  // custom_id → line
};

}  // namespace hr::api
