// File storage in Postgres.
#include "queue/files.h"

#include <algorithm>
#include <array>

#include "base/ids.h"
#include "queue/internal/retention_choice.h"
#include "queue/pg.h"

namespace hr::queue {
namespace {

constexpr const char* kFileColumns =
    "id::text, purpose, filename, bytes, coalesce(num_lines, 0), "
    "(extract(epoch FROM created_at) * 1000)::bigint, "
    "(extract(epoch FROM expires_at) * 1000)::bigint";

FileInfo file_from_row(const pqxx::row& r) {
  FileInfo f;
  f.id = r[0].as<std::string>();
  f.purpose = r[1].as<std::string>();
  f.filename = r[2].as<std::string>();
  f.bytes = r[3].as<int64_t>();
  f.num_lines = r[4].as<int>();
  f.created_at_ms = r[5].as<int64_t>();
  f.expires_at_ms = r[6].as<int64_t>();
  return f;
}

// Appends a bytea value in Postgres's hex output format ("\x" then two hex digits a byte), decoding
// it directly into `out` (libpqxx's binarystring would copy it twice).
bool append_bytea(const pqxx::field& f, std::string* out) {
  const char* s = f.c_str();
  size_t n = f.size();
  if (n < 2 || s[0] != '\\' || s[1] != 'x') {
    pqxx::binarystring b(f);  // the old "escape" format
    out->append(b.str());
    return true;
  }
  static const std::array<int8_t, 256> kHex = [] {
    std::array<int8_t, 256> t{};
    t.fill(-1);
    for (int i = 0; i < 10; ++i) t['0' + i] = static_cast<int8_t>(i);
    for (int i = 0; i < 6; ++i) {
      t['a' + i] = static_cast<int8_t>(10 + i);
      t['A' + i] = static_cast<int8_t>(10 + i);
    }
    return t;
  }();
  size_t start = out->size();
  size_t len = (n - 2) / 2;
  out->resize(start + len);
  char* dst = out->data() + start;
  const unsigned char* src = reinterpret_cast<const unsigned char*>(s + 2);
  for (size_t i = 0; i < len; ++i) {
    int hi = kHex[src[2 * i]];
    int lo = kHex[src[2 * i + 1]];
    if ((hi | lo) < 0) return false;
    dst[i] = static_cast<char>((hi << 4) | lo);
  }
  return true;
}

}  // namespace

FileInfo insert_file(pqxx::work& tx, const NewFile& file) {
  std::string id = new_uuid_v7().to_string();
  pqxx::row r = tx.exec_params1(
      "INSERT INTO files (id, account_id, purpose, filename, bytes, num_lines, expires_at) "
      "VALUES ($1, $2, $3, $4, $5, $6, now() + " +
          chosen_retention("$7", "$2", "$8") + " * interval '1 second') RETURNING " +
          std::string(kFileColumns),
      id, file.account_id, file.purpose, file.filename, static_cast<int64_t>(file.content.size()),
      file.num_lines, file.retain_seconds, file.default_retain_seconds);
  // Binary parameters: the bytes travel as they are, with no escaping.
  int seq = 0;
  for (size_t off = 0; off < file.content.size(); off += kFileChunkBytes, ++seq) {
    size_t n = std::min<size_t>(kFileChunkBytes, file.content.size() - off);
    tx.exec_params("INSERT INTO file_chunks (file_id, seq, data) VALUES ($1, $2, $3)", id, seq,
                   pqxx::binarystring(file.content.data() + off, n));
  }
  return file_from_row(r);
}

FileWriter::FileWriter(pqxx::work& tx, const NewFile& header)
    : tx_(tx), id_(new_uuid_v7().to_string()) {
  tx_.exec_params(
      "INSERT INTO files (id, account_id, purpose, filename, bytes, num_lines, expires_at) "
      "VALUES ($1, $2, $3, $4, 0, 0, now() + " +
          chosen_retention("$5", "$2", "$6") + " * interval '1 second')",
      id_, header.account_id, header.purpose, header.filename, header.retain_seconds,
      header.default_retain_seconds);
}

void FileWriter::write_chunk(std::string_view bytes) {
  tx_.exec_params("INSERT INTO file_chunks (file_id, seq, data) VALUES ($1, $2, $3)", id_, seq_++,
                  pqxx::binarystring(bytes.data(), bytes.size()));
}

void FileWriter::append(std::string_view bytes, int lines) {
  bytes_ += static_cast<int64_t>(bytes.size());
  lines_ += lines;
  // Every chunk but the last holds exactly kFileChunkBytes (readers find a byte's chunk by it).
  while (!bytes.empty()) {
    const size_t chunk = static_cast<size_t>(kFileChunkBytes);
    const size_t take = std::min(bytes.size(), chunk - pending_.size());
    if (pending_.empty() && take == chunk) {
      write_chunk(bytes.substr(0, take));
    } else {
      pending_.append(bytes.substr(0, take));
      if (pending_.size() == chunk) {
        write_chunk(pending_);
        pending_.clear();
      }
    }
    bytes.remove_prefix(take);
  }
}

FileInfo FileWriter::finish() {
  if (!pending_.empty()) write_chunk(pending_);
  pending_.clear();
  pqxx::row r = tx_.exec_params1(
      "UPDATE files SET bytes = $2, num_lines = $3 WHERE id = $1 "
      "RETURNING " +
          std::string(kFileColumns),
      id_, bytes_, lines_);
  return file_from_row(r);
}

Result<FileInfo> create_file(pqxx::connection& conn, const NewFile& file) {
  FileInfo out;
  Status st = pg_guard("create file", [&]() -> Status {
    pqxx::work tx(conn);
    out = insert_file(tx, file);
    tx.commit();
    return Status::ok();
  });
  if (!st.is_ok()) return st;
  return out;
}

Result<FileInfo> get_file(pqxx::connection& conn, const std::string& account_id,
                          const std::string& file_id) {
  FileInfo out;
  Status st = pg_guard("get file", [&]() -> Status {
    pqxx::nontransaction tx(conn);
    pqxx::result r = tx.exec_params(
        std::string("SELECT ") + kFileColumns +
            " FROM files WHERE id = $1::uuid AND account_id = $2 AND deleted_at IS NULL "
            "AND expires_at > now()",
        file_id, account_id);
    if (r.empty()) return not_found("no such file: " + file_id);
    out = file_from_row(r[0]);
    return Status::ok();
  });
  if (!st.is_ok()) return st;
  return out;
}

Result<std::vector<FileInfo>> list_files(pqxx::connection& conn, const std::string& account_id,
                                         const FileListQuery& query) {
  std::vector<FileInfo> out;
  Status st = pg_guard("list files", [&]() -> Status {
    pqxx::nontransaction tx(conn);
    std::string sql = std::string("SELECT ") + kFileColumns +
                      " FROM files WHERE account_id = $1 AND deleted_at IS NULL "
                      "AND expires_at > now() AND ($2::text IS NULL OR purpose = $2) ";
    sql += query.ascending ? "AND ($3::uuid IS NULL OR id > $3::uuid) ORDER BY id LIMIT $4"
                           : "AND ($3::uuid IS NULL OR id < $3::uuid) ORDER BY id DESC LIMIT $4";
    for (const auto& row :
         tx.exec_params(sql, account_id, query.purpose, query.after, query.limit)) {
      out.push_back(file_from_row(row));
    }
    return Status::ok();
  });
  if (!st.is_ok()) return st;
  return out;
}

Status delete_file(pqxx::connection& conn, const std::string& account_id,
                   const std::string& file_id) {
  return pg_guard("delete file", [&]() -> Status {
    pqxx::work tx(conn);
    pqxx::result r = tx.exec_params(
        "UPDATE files SET deleted_at = now() WHERE id = $1::uuid AND account_id = $2 "
        "AND deleted_at IS NULL RETURNING 1",
        file_id, account_id);
    if (r.empty()) return not_found("no such file: " + file_id);
    tx.exec_params("DELETE FROM file_chunks WHERE file_id = $1::uuid", file_id);
    tx.commit();
    return Status::ok();
  });
}

Result<bool> read_file_chunk(pqxx::connection& conn, const std::string& file_id, int seq,
                             std::string* out) {
  bool found = false;
  Status st = pg_guard("read file", [&]() -> Status {
    conn.prepare("hr_file_chunk",
                 "SELECT data FROM file_chunks WHERE file_id = $1::uuid AND seq = $2");
    pqxx::nontransaction tx(conn);
    pqxx::result r = tx.exec_prepared("hr_file_chunk", file_id, seq);
    if (r.empty()) return Status::ok();
    if (!append_bytea(r[0][0], out)) return internal_error("file chunk is not valid bytea hex");
    found = true;
    return Status::ok();
  });
  if (!st.is_ok()) return st;
  return found;
}

Result<std::string> read_file(pqxx::connection& conn, const FileInfo& file) {
  std::string out;
  out.reserve(static_cast<size_t>(file.bytes));
  for (int seq = 0; seq < file.num_chunks(); ++seq) {
    HR_ASSIGN_OR_RETURN(bool found, read_file_chunk(conn, file.id, seq, &out));
    if (!found) return not_found("file " + file.id + " was deleted while it was read");
  }
  return out;
}

}  // namespace hr::queue
