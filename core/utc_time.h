// The current UTC time as text, from one reading of the clock (a second and
// its milliseconds read apart can tear: 59 s with the next second's .000).
#pragma once

#include <string>

namespace coverage {

// 2026-12-07T02:24:01.123Z: what the registry stores (sorts as text).
std::string UtcNowIso8601Ms();
// 20261207T022401123Z: for ids and file names.
std::string UtcNowCompactMs();

}  // namespace coverage
