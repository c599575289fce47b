// The opaque pagination cursor of `GET /api/models` (the `cursor=` parameter
// of the `Link: <...>; rel="next"` URL).
//
// Wire form: URL-safe base64 without padding of a small JSON object, e.g.
// {"s":"downloads","d":-1,"p":1000} (`p`: the next position in the listing's
// order) or, for orders a synthetic hub computes by scanning,
// {"s":"id","d":1,"k":"<last key served>","i":<its model index>}. Clients must
// treat it as opaque, as with the real Hub; tests may decode it to jump deep
// into a listing.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace coverage::hub_replay {

struct Cursor {
  std::string sort;       // wire name of the sort key the cursor belongs to
  int direction = -1;     // -1 descending, 1 ascending
  int64_t position = -1;  // rank-order cursors: next position; -1 for key cursors
  std::string key;        // key cursors: sort key of the last model served...
  int64_t index = -1;     // ...and its model index (breaks ties)
};

std::string EncodeCursor(const Cursor& cursor);

// nullopt for anything that is not a cursor EncodeCursor made (bad base64,
// bad JSON, missing or mistyped fields); range checks are the caller's.
std::optional<Cursor> DecodeCursor(std::string_view text);

// URL-safe base64 (RFC 4648 §5) without padding, and its strict inverse.
std::string Base64UrlEncode(std::string_view bytes);
std::optional<std::string> Base64UrlDecode(std::string_view text);

}  // namespace coverage::hub_replay
