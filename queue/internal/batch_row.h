// Shared by the store's translation units: the batch columns every batch read selects, turning such
// a row into a BatchInfo. Private to queue/.
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

}  // namespace hr::queue
