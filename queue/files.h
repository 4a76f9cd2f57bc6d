// Files of the OpenAI Batch API, stored durably in Postgres: one `files` row per file and its bytes
// in `file_chunks` (bytea, kFileChunkBytes per chunk, numbered from 0). Every read and write is
// scoped to an account: another account's file, a deleted one or an expired one, is kNotFound.
// Deleting keeps the row (deleted_at) and drops the bytes. Functions take a connection owned by the
// caller's thread.
#pragma once

#include <pqxx/pqxx>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace hr::queue {

inline constexpr int64_t kFileChunkBytes = 4 << 20;
// How long batches and files are kept when nothing else says (--retention-days).
inline constexpr int64_t kDefaultRetainSeconds = 30 * 86400;

struct FileInfo {
  std::string id;
  std::string purpose;  // "batch" (uploads), "batch_output" (written by finalization)
  std::string filename;
  int64_t bytes = 0;
  int num_lines = 0;
  int64_t created_at_ms = 0;
  int64_t expires_at_ms = 0;  // after this the file is gone: reads answer not found, the purge
                              // removes it (queue/retention.h)
  int num_chunks() const {
    return static_cast<int>((bytes + kFileChunkBytes - 1) / kFileChunkBytes);
  }
};

struct NewFile {
  std::string account_id;
  std::string purpose;
  std::string filename;
  std::string_view content;  // not owned; read during the call
  int num_lines = 0;
  // How long it is kept: these seconds from now, else the account's default, else
  // `default_retain_seconds` (the server's --retention-days).
  std::optional<int64_t> retain_seconds;
  int64_t default_retain_seconds = kDefaultRetainSeconds;
};

// Stores a file in one transaction; returns it after COMMIT.
[[nodiscard]] Result<FileInfo> create_file(pqxx::connection& conn, const NewFile& file);
// The same inside the caller's transaction (libpqxx errors propagate as exceptions).
FileInfo insert_file(pqxx::work& tx, const NewFile& file);

// A file written a piece at a time inside the caller's transaction: its row is inserted at once,
// each chunk as soon as it is full, and its size at finish(), so that memory holds at most one
// chunk however large the file. `header`'s content is not used. libpqxx errors propagate.
class FileWriter {
 public:
  FileWriter(pqxx::work& tx, const NewFile& header);
  void append(std::string_view bytes, int lines);
  // Writes the last chunk and the file's size; returns the file.
  FileInfo finish();

 private:
  void write_chunk(std::string_view bytes);
  pqxx::work& tx_;
  std::string id_;
  std::string pending_;  // less than a chunk
  int seq_ = 0;
  int64_t bytes_ = 0;
  int lines_ = 0;
};

[[nodiscard]] Result<FileInfo> get_file(pqxx::connection& conn, const std::string& account_id,
                                        const std::string& file_id);

struct FileListQuery {
  std::optional<std::string> purpose;
  int limit = 100;
  std::optional<std::string> after;  // a file id: continue past it in the listing order
  bool ascending = false;            // default newest first
};

[[nodiscard]] Result<std::vector<FileInfo>> list_files(pqxx::connection& conn,
                                                       const std::string& account_id,
                                                       const FileListQuery& query);

// Marks the file deleted and drops its bytes; kNotFound when it is not there (or already gone).
[[nodiscard]] Status delete_file(pqxx::connection& conn, const std::string& account_id,
                                 const std::string& file_id);

// Appends chunk `seq` of the file to `out`; false when there is no such chunk (past the end, or
// the file was deleted meanwhile). The caller checked the file's account with get_file().
[[nodiscard]] Result<bool> read_file_chunk(pqxx::connection& conn, const std::string& file_id,
                                           int seq, std::string* out);
// The whole content of a file the caller has checked with get_file().
[[nodiscard]] Result<std::string> read_file(pqxx::connection& conn, const FileInfo& file);

}  // namespace hr::queue
