// Result<T>: a value or an error Status, shaped like C++23 std::expected so
// that moving to it later is a rename. GCC 12 in C++20 mode lacks
// <expected>, hence this small class.
//
//   Result<int> ParsePort(std::string_view s);
//   auto port = ParsePort(flag);
//   if (!port) return port.error();
//   Use(*port);
#pragma once

#include <cstdlib>
#include <cstdio>
#include <type_traits>
#include <utility>
#include <variant>

#include "core/status.h"

namespace coverage {

template <typename T>
class [[nodiscard]] Result {
  static_assert(!std::is_same_v<T, Status>, "Result<Status> makes no sense");

 public:
  // Implicit from a value or from a non-OK status, like std::expected.
  Result(T value) : storage_(std::in_place_index<0>, std::move(value)) {}  // NOLINT
  Result(Status status) : storage_(std::in_place_index<1>, std::move(status)) {  // NOLINT
    if (std::get<1>(storage_).ok()) {
      std::fprintf(stderr, "Result constructed from an OK Status without a value\n");
      std::abort();
    }
  }

  bool has_value() const { return storage_.index() == 0; }
  explicit operator bool() const { return has_value(); }

  T& value() & { CheckValue(); return std::get<0>(storage_); }
  const T& value() const& { CheckValue(); return std::get<0>(storage_); }
  T&& value() && { CheckValue(); return std::get<0>(std::move(storage_)); }

  // The error; OK if this holds a value.
  Status error() const { return has_value() ? Status::Ok() : std::get<1>(storage_); }

  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  template <typename U>
  T value_or(U&& fallback) const& {
    return has_value() ? std::get<0>(storage_) : static_cast<T>(std::forward<U>(fallback));
  }

 private:
  void CheckValue() const {
    if (!has_value()) {
      std::fprintf(stderr, "Result::value() on error: %s\n", std::get<1>(storage_).ToString().c_str());
      std::abort();
    }
  }
  std::variant<T, Status> storage_;
};

}  // namespace coverage
