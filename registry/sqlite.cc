#include "registry/sqlite.h"

#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include <fmt/format.h>

namespace coverage::registry {

Statement::Statement(Database* db, sqlite3_stmt* stmt, std::string sql)
    : db_(db), stmt_(stmt), sql_(std::move(sql)) {}

Statement::Statement(Statement&& other) noexcept
    : db_(other.db_), stmt_(other.stmt_), sql_(std::move(other.sql_)), bind_error_(other.bind_error_) {
  other.stmt_ = nullptr;
}

Statement& Statement::operator=(Statement&& other) noexcept {
  if (this != &other) {
    if (stmt_) sqlite3_finalize(stmt_);
    db_ = other.db_;
    stmt_ = other.stmt_;
    sql_ = std::move(other.sql_);
    bind_error_ = other.bind_error_;
    other.stmt_ = nullptr;
  }
  return *this;
}

Statement::~Statement() {
  if (stmt_) sqlite3_finalize(stmt_);
}

Statement& Statement::Bind(int index, int64_t value) {
  int rc = sqlite3_bind_int64(stmt_, index, value);
  if (rc != SQLITE_OK && !bind_error_) bind_error_ = rc;
  return *this;
}

Statement& Statement::Bind(int index, double value) {
  int rc = sqlite3_bind_double(stmt_, index, value);
  if (rc != SQLITE_OK && !bind_error_) bind_error_ = rc;
  return *this;
}

Statement& Statement::Bind(int index, std::string_view value) {
  int rc = sqlite3_bind_text(stmt_, index, value.data(), static_cast<int>(value.size()), SQLITE_TRANSIENT);
  if (rc != SQLITE_OK && !bind_error_) bind_error_ = rc;
  return *this;
}

Statement& Statement::BindNull(int index) {
  int rc = sqlite3_bind_null(stmt_, index);
  if (rc != SQLITE_OK && !bind_error_) bind_error_ = rc;
  return *this;
}

Status Statement::Error(std::string_view what) const {
  std::string sql = sql_.size() > 120 ? sql_.substr(0, 117) + "..." : sql_;
  return db_->Failure(sqlite3_extended_errcode(db_->db_),
                      std::string(what) + " in " + db_->path() + ": " + db_->LastError() + " [" + sql + "]");
}

Result<bool> Statement::Step() {
  if (bind_error_) {
    return Status::Internal("binding a parameter failed (" + std::string(sqlite3_errstr(bind_error_)) + ") [" +
                            sql_ + "]");
  }
  int rc = sqlite3_step(stmt_);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  return Error("query failed");
}

Status Statement::Run() {
  for (;;) {
    COV_ASSIGN_OR_RETURN(bool row, Step());
    if (!row) break;
  }
  return Reset();
}

Status Statement::Reset() {
  sqlite3_reset(stmt_);
  sqlite3_clear_bindings(stmt_);
  bind_error_ = 0;
  return Status::Ok();
}

int Statement::ColumnCount() const { return sqlite3_column_count(stmt_); }
std::string Statement::ColumnName(int col) const { return sqlite3_column_name(stmt_, col); }
bool Statement::IsNull(int col) const { return sqlite3_column_type(stmt_, col) == SQLITE_NULL; }
int64_t Statement::Int(int col) const { return sqlite3_column_int64(stmt_, col); }
double Statement::Double(int col) const { return sqlite3_column_double(stmt_, col); }

std::string Statement::Text(int col) const {
  const unsigned char* p = sqlite3_column_text(stmt_, col);
  if (!p) return {};
  return std::string(reinterpret_cast<const char*>(p), sqlite3_column_bytes(stmt_, col));
}

std::optional<double> Statement::OptionalDouble(int col) const {
  if (IsNull(col)) return std::nullopt;
  return Double(col);
}

// Note [Busy registry]
// ~~~~~~~~~~~~~~~~~~~~
// One registry may have several writers (a run and a capture, shards on a
// shared disk, a developer's sqlite3 shell). SQLite's busy handler waits for
// the other writer, sleeping in growing steps, up to the busy timeout:
// 60 s by default, `--busy-timeout` (or $COVERAGE_BUSY_TIMEOUT) seconds. A
// writer still blocked after that gets an error that says so and how to go
// on; every transaction is atomic, so what was stored before stays.
Status Database::Failure(int rc, const std::string& what) const {
  const int primary = rc & 0xff;
  if (primary == SQLITE_BUSY || primary == SQLITE_LOCKED) {
    return Status::Aborted("registry '" + path_ + "' is locked by another writer (another coverage process, or an "
                           "open transaction in a sqlite3 shell) and stayed locked for the busy timeout of " +
                           fmt::format("{:g}", busy_timeout_ms_ / 1000.0) +
                           " s; nothing stored was lost: run the same command again (the same --run id resumes), "
                           "or wait longer with --busy-timeout SECONDS [" + what + "]");
  }
  return Status::IoError(what);
}

namespace {

// Explains why `path` cannot be a registry before SQLite says "unable to
// open database file" or "disk I/O error".
Status CheckRegistryPath(const std::string& path, bool read_only) {
  if (path == ":memory:" || path.empty()) return Status::Ok();
  struct stat st {};
  if (stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    return Status::InvalidArgument("'" + path + "' is a folder, not a registry file; name a file in it, e.g. '" +
                                   (path.back() == '/' ? path : path + "/") + "coverage.db'");
  }
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  const std::string dir = parent.empty() ? "." : parent.string();
  if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return Status::NotFound("the folder '" + dir + "' of registry '" + path + "' does not exist; create it first");
  }
  if (!read_only && access(dir.c_str(), W_OK) != 0) {
    return Status::InvalidArgument("cannot write in the folder '" + dir + "' of registry '" + path +
                                   "': SQLite creates its '-wal' and '-shm' files beside the registry, so the folder "
                                   "must be writable (copy the registry to a writable folder to use it)");
  }
  if (!read_only && access(path.c_str(), F_OK) == 0 && access(path.c_str(), W_OK) != 0) {
    return Status::InvalidArgument("registry '" + path + "' is read-only; make it writable or copy it");
  }
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<Database>> Database::Open(const std::string& path, bool read_only, int busy_timeout_ms) {
  COV_RETURN_IF_ERROR(CheckRegistryPath(path, read_only));
  sqlite3* db = nullptr;
  int flags = read_only ? SQLITE_OPEN_READONLY : (SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE);
  int rc = sqlite3_open_v2(path.c_str(), &db, flags | SQLITE_OPEN_NOMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    std::string msg = db ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
    if (db) sqlite3_close(db);
    return Status::IoError("cannot open database '" + path + "': " + msg);
  }
  std::unique_ptr<Database> out(new Database(db, path, busy_timeout_ms));
  sqlite3_busy_timeout(db, busy_timeout_ms);
  sqlite3_extended_result_codes(db, 1);
  // SQLite opens lazily: read the header now so a foreign file is named as such.
  if (sqlite3_exec(db, "PRAGMA schema_version", nullptr, nullptr, nullptr) == SQLITE_NOTADB) {
    return Status::InvalidArgument("'" + path + "' is not an SQLite database (so not a coverage registry); "
                                   "it was left unchanged");
  }
  if (!read_only) {
    COV_RETURN_IF_ERROR(out->Exec("PRAGMA journal_mode=WAL").WithContext("enabling WAL"));
    COV_RETURN_IF_ERROR(out->Exec("PRAGMA synchronous=NORMAL"));
  }
  COV_RETURN_IF_ERROR(out->Exec("PRAGMA foreign_keys=ON"));
  return out;
}

Database::~Database() { sqlite3_close_v2(db_); }

Result<Statement> Database::Prepare(std::string_view sql) {
  sqlite3_stmt* stmt = nullptr;
  int rc = sqlite3_prepare_v2(db_, sql.data(), static_cast<int>(sql.size()), &stmt, nullptr);
  if (rc != SQLITE_OK) {
    return Status::IoError("cannot prepare statement in " + path_ + ": " + LastError() + " [" + std::string(sql) + "]");
  }
  return Statement(this, stmt, std::string(sql));
}

Status Database::Exec(std::string_view sql) {
  std::string owned(sql);
  char* err = nullptr;
  int rc = sqlite3_exec(db_, owned.c_str(), nullptr, nullptr, &err);
  if (rc != SQLITE_OK) {
    std::string msg = err ? err : sqlite3_errstr(rc);
    sqlite3_free(err);
    std::string shown = owned.size() > 120 ? owned.substr(0, 117) + "..." : owned;
    return Failure(sqlite3_extended_errcode(db_), path_ + ": " + msg + " [" + shown + "]");
  }
  return Status::Ok();
}

int64_t Database::LastInsertRowId() const { return sqlite3_last_insert_rowid(db_); }
int Database::Changes() const { return sqlite3_changes(db_); }
std::string Database::LastError() const { return sqlite3_errmsg(db_); }

}  // namespace coverage::registry
