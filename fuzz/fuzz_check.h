// What every fuzz target shares: the input as text, and invariant checks
// that abort (libFuzzer then keeps the input as a crash and prints it).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/json_double.h"
#include "core/status.h"

// FUZZ_CHECK(cond, detail): `detail` is anything std::string can be built
// from, printed with the failed condition.
#define FUZZ_CHECK(cond, detail)                                                                   \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      std::fprintf(stderr, "fuzz invariant failed at %s:%d: %s\n  %s\n", __FILE__, __LINE__, #cond, \
                   std::string(detail).c_str());                                                   \
      std::abort();                                                                                \
    }                                                                                              \
  } while (0)

namespace coverage::fuzz {

inline std::string_view AsText(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// Parsers of outside input report bad input as a value; Internal would mean
// an exception was caught inside, i.e. a bug.
inline bool IsInputError(const Status& s) { return !s.ok() && s.code() != StatusCode::kInternal; }

// JSON text for comparisons (never throws on bytes that are not UTF-8).
inline std::string Dump(const nlohmann::json& j) { return DumpJson(j); }

}  // namespace coverage::fuzz
