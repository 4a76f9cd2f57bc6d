// Shared by the store's translation units: the batch columns every batch read selects, turning such
// a row into a BatchInfo. Private to queue/.
#pragma once

#include <nlohmann/json.hpp>
#include <pqxx/pqxx>

#include <string>

#include "queue/store.h"

namespace hr::queue {

// The columns batch_from_row() reads, in its order (23 columns), from `batches` (not aliased).
extern const char* const kBatchColumns;
constexpr int kNumBatchColumns = 23;
// A WHERE condition: the batch is neither deleted nor expired.
extern const char* const kBatchVisible;

BatchInfo batch_from_row(const pqxx::row& r);

// Not found for a deleted batch; not found saying when, for an expired one.
Status check_visible(const BatchInfo& b);

}  // namespace hr::queue
