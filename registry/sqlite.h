// A thin RAII wrapper over the SQLite C API: the only place besides
// sqlite.cc that knows SQLite exists. Every failure becomes a Status naming
// the database file and the statement.
//
// Thread safety: a Database and its Statements belong to one thread at a
// time (SQLite's "multi-thread" mode).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>
#include <string_view>

#include "core/result.h"

struct sqlite3;
struct sqlite3_stmt;

namespace coverage::registry {

class Database;

class Statement {
 public:
  Statement(Statement&&) noexcept;
  Statement& operator=(Statement&&) noexcept;
  ~Statement();

  // Parameters are 1-based, as in SQLite.
  Statement& Bind(int index, int64_t value);
  Statement& Bind(int index, int value) { return Bind(index, static_cast<int64_t>(value)); }
  Statement& Bind(int index, double value);
  Statement& Bind(int index, std::string_view value);
  Statement& Bind(int index, const char* value) { return Bind(index, std::string_view(value)); }
  Statement& Bind(int index, const std::string& value) { return Bind(index, std::string_view(value)); }
  Statement& BindNull(int index);
  Statement& Bind(int index, std::optional<double> value) {
    return value ? Bind(index, *value) : BindNull(index);
  }

  // Advances to the next row. Returns true while a row is available, false
  // when done; errors are Statuses.
  Result<bool> Step();
  // Runs a statement that returns no rows to completion.
  Status Run();
  Status Reset();

  int ColumnCount() const;
  std::string ColumnName(int col) const;
  bool IsNull(int col) const;
  int64_t Int(int col) const;
  double Double(int col) const;
  std::string Text(int col) const;
  std::optional<double> OptionalDouble(int col) const;

 private:
  friend class Database;
  Statement(Database* db, sqlite3_stmt* stmt, std::string sql);
  Status Error(std::string_view what) const;

  Database* db_ = nullptr;
  sqlite3_stmt* stmt_ = nullptr;
  std::string sql_;
  int bind_error_ = 0;  // first failed bind, reported by Step()
};

class Database {
 public:
  // Opens (creating if needed) the file at `path` with WAL journaling,
  // foreign keys on and a busy timeout (Note [Busy registry]). ":memory:"
  // opens a private database. A directory, a missing folder or a folder
  // SQLite cannot create its -wal and -shm files in is named as such.
  static Result<std::unique_ptr<Database>> Open(const std::string& path, bool read_only = false,
                                                int busy_timeout_ms = kDefaultBusyTimeoutMs);
  static constexpr int kDefaultBusyTimeoutMs = 60000;
  ~Database();
  Database(const Database&) = delete;
  Database& operator=(const Database&) = delete;

  Result<Statement> Prepare(std::string_view sql);
  // Runs one or more statements that return no rows.
  Status Exec(std::string_view sql);

  int64_t LastInsertRowId() const;
  int Changes() const;
  const std::string& path() const { return path_; }
  std::string LastError() const;
  // The Status of a failed call with SQLite result code `rc`: a busy or
  // locked database says who holds it and how to go on; others name `what`.
  Status Failure(int rc, const std::string& what) const;

 private:
  friend class Statement;
  Database(sqlite3* db, std::string path, int busy_timeout_ms)
      : db_(db), path_(std::move(path)), busy_timeout_ms_(busy_timeout_ms) {}
  sqlite3* db_;
  std::string path_;
  int busy_timeout_ms_;
};

// Runs `body` in a transaction (BEGIN IMMEDIATE), committing if it returns OK
// and rolling back otherwise. Nested use is not supported.
template <typename Fn>
Status InTransaction(Database& db, Fn&& body) {
  COV_RETURN_IF_ERROR(db.Exec("BEGIN IMMEDIATE"));
  Status s = body();
  if (s.ok()) s = db.Exec("COMMIT");
  if (!s.ok()) db.Exec("ROLLBACK").IgnoreError();
  return s;
}

// The first column of every row, as text.
inline Result<std::vector<std::string>> FirstColumn(Statement& stmt) {
  std::vector<std::string> out;
  for (;;) {
    COV_ASSIGN_OR_RETURN(bool row, stmt.Step());
    if (!row) break;
    out.push_back(stmt.Text(0));
  }
  return out;
}

}  // namespace coverage::registry
