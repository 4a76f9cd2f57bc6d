// OpenAI's file and batch objects, built from stored rows (fields in OpenAI's order), and the
// mapping from the internal batch status to OpenAI's. Pure functions.
//
// Status mapping (internal status, finished_at, finalized_at → OpenAI):
//   failed with validation errors (no requests)            → failed
//   not finished, cancel requested                         → cancelling
//   not finished                                           → in_progress (validation ran at create)
//   finished, files not written yet: cancelled             → cancelling; otherwise → finalizing
//   finalized: cancelled → cancelled; expired → expired;
//              completed, completed_with_errors, failed    → completed (request_counts.failed says
//              how many failed; OpenAI keeps "failed" for a batch whose input failed validation)
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "queue/files.h"
#include "queue/openai_batches.h"

namespace hr::api {

// {id, object: "file", bytes, created_at, filename, purpose, status: "processed", ...}
nlohmann::ordered_json file_object(const queue::FileInfo& file);

std::string openai_batch_status(const queue::OpenAiBatch& batch);

// {id, object: "batch", endpoint, errors, input_file_id, completion_window, status, ...,
//  request_counts: {total, completed, failed}, metadata, model, usage}
nlohmann::ordered_json batch_object(const queue::OpenAiBatch& batch);

}  // namespace hr::api
