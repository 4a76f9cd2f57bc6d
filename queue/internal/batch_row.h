// Shared by the store's translation units: the batch columns every batch read selects, turning such
// a row into a BatchInfo, and writing an outbox event. Private to queue/.
#pragma once

#include <nlohmann/json.hpp>
#include <pqxx/pqxx>

#include <string>

#include "queue/store.h"

namespace hr::queue {

// The columns batch_from_row() reads, in its order (17 columns).
extern const char* const kBatchColumns;
constexpr int kNumBatchColumns = 17;

BatchInfo batch_from_row(const pqxx::row& r);

// Adds an event for the batch to the outbox, in `tx`.
void write_event(pqxx::work& tx, const std::string& type, const std::string& account_id,
                 const std::string& batch_id, const nlohmann::json& data);

}  // namespace hr::queue
