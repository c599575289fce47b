// Text that leaves the tool as part of something else: a run id that becomes
// a file name, a value printed into a shell command or an SQL statement for
// the user to paste. Torch-free, no state.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "core/status.h"

namespace coverage {

// Note [Run ids]
// ~~~~~~~~~~~~~~
// A run id names a run in the registry and, under reports/, the folder of
// its report, and it is printed into commands ("resume with --run ID"). So
// it is one path component and one shell word: 1 to 128 characters of
// letters, digits, '.', '_' and '-', starting with a letter or a digit (no
// "..", no option look-alike such as "--run", no slash, no newline).
inline constexpr size_t kMaxRunIdLength = 128;

// Ok, or InvalidArgument naming `what` (e.g. "--run"; empty: no prefix), the
// id and what is wrong.
Status CheckRunId(std::string_view id, std::string_view what = "run id");

// `s` as one POSIX shell word: unchanged when it only has characters no
// shell treats specially, else in single quotes (a quote inside becomes
// '\'').
std::string ShellQuote(std::string_view s);

// `s` as an SQL string literal: in single quotes, each quote doubled.
std::string SqlQuote(std::string_view s);

// Note [Terminal-safe text]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// Text from outside (a model id or config from the Hub, a tracer's output)
// printed where a person reads it (the progress line, tables, errors,
// summaries) must not steer the terminal: every control character (C0, DEL,
// C1: escapes, NULs, carriage returns, newlines too) and every byte that is
// not valid UTF-8 becomes a visible \xNN; valid UTF-8 text is kept. At most
// `max_bytes` of the input are shown, then "...".
std::string TerminalSafe(std::string_view s, size_t max_bytes = std::string_view::npos);

// The code point of the shortest-form UTF-8 sequence at text[*i] (not a
// surrogate, at most U+10FFFF), advancing past it; nullopt for a byte that
// starts no such sequence, advancing past that byte alone.
std::optional<char32_t> NextUtf8CodePoint(std::string_view text, size_t* i);

}  // namespace coverage
