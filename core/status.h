// Status: the outcome of a harness operation (I/O, parsing, database work).
//
// A Status is either OK or carries a code and a message that names the input
// and what was wrong with it. Backend failures are NOT statuses: an op that
// mismatches or throws on the backend under test produces an Outcome (see
// outcome.h) that is stored and reported. Status is for the harness itself.
//
// Thread safety: Status is a value type; distinct objects may be used from
// distinct threads freely.
#pragma once

#include <string>
#include <string_view>
#include <utility>

namespace coverage {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // bad user input: a flag, a file, a config value
  kNotFound,         // a named thing (run, case, file) does not exist
  kAlreadyExists,
  kIoError,          // the OS or SQLite failed to read or write
  kCorruption,       // stored data does not parse or violates the schema
  kUnsupported,      // a valid request this build cannot serve
  kAborted,          // interrupted by the user (SIGINT) or a deadline
  kInternal,         // a bug in coverage; should be reported
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
  static Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
  static Status AlreadyExists(std::string m) { return {StatusCode::kAlreadyExists, std::move(m)}; }
  static Status IoError(std::string m) { return {StatusCode::kIoError, std::move(m)}; }
  static Status Corruption(std::string m) { return {StatusCode::kCorruption, std::move(m)}; }
  static Status Unsupported(std::string m) { return {StatusCode::kUnsupported, std::move(m)}; }
  static Status Aborted(std::string m) { return {StatusCode::kAborted, std::move(m)}; }
  static Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // "InvalidArgument: --dim 'x[0]>>3': expected one of == != < <= > >=".
  std::string ToString() const;

  // Returns a copy whose message is "<context>: <message>".
  Status WithContext(std::string_view context) const;

  // Marks a status as deliberately ignored.
  void IgnoreError() const {}

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

}  // namespace coverage

#define COV_CONCAT_INNER_(a, b) a##b
#define COV_CONCAT_(a, b) COV_CONCAT_INNER_(a, b)

// Returns early from the enclosing function if `expr` (a Status) is not OK.
#define COV_RETURN_IF_ERROR(expr)                            \
  do {                                                       \
    ::coverage::Status _cov_status = (expr);                 \
    if (!_cov_status.ok()) return _cov_status;               \
  } while (0)

// `COV_ASSIGN_OR_RETURN(auto x, MakeX());` unwraps a Result<T> or returns its
// error from the enclosing function.
#define COV_ASSIGN_OR_RETURN(lhs, expr) \
  COV_ASSIGN_OR_RETURN_IMPL_(COV_CONCAT_(_cov_result_, __LINE__), lhs, expr)
#define COV_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  if (!tmp.has_value()) return tmp.error();        \
  lhs = std::move(tmp).value()
