// The served set of models behind hub-replay, and the `GET /api/models` query
// over it.
//
// A Catalog is either the real recorded data (real_catalog.h) or a synthetic
// hub computed lazily from a seed (synthetic_catalog.h). Models are addressed
// by an index in [0, size()). Listing orders come in two kinds: a *rank order*
// gives the index at any position in O(1) (all orders of the real data; the
// downloads, likes and createdAt orders of a synthetic hub), and other orders
// are computed by a scan over every model (ScanKey).
//
// Thread safety: a Catalog is immutable once built; all methods are const and
// may be called from many threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"
#include "tools/hub-replay/cursor.h"

namespace coverage::hub_replay {

// One model as the API serves it. Strings are already in wire form.
struct ModelRecord {
  std::string mongo_id;  // `_id`: 24 hex digits
  std::string id;        // also `modelId`
  std::string author;    // "" = none
  std::string sha;
  std::string created_at;     // ISO-8601 with milliseconds and 'Z'
  std::string last_modified;  // same form
  bool is_private = false;
  std::string gated;  // "" = false; otherwise "auto" or "manual"
  bool disabled = false;
  int64_t downloads = 0;
  int64_t likes = 0;
  std::string library_name;  // "" = absent
  std::string pipeline_tag;  // "" = absent
  std::vector<std::string> tags;
  nlohmann::ordered_json config_subset;  // null, or {"architectures": [...], "model_type": "..."} (keys present)
  bool has_config_file = false;          // whether {id}/resolve/main/config.json exists
};

enum class SortKey { kDownloads, kLikes, kCreatedAt, kLastModified, kId };

// Wire names: downloads, likes, createdAt, lastModified, id.
std::optional<SortKey> ParseSortKey(std::string_view wire);
std::string SortKeyName(SortKey key);

struct ListQuery {
  std::vector<std::string> search;   // each a lower-cased substring the lower-cased id must contain
  std::string author;                // exact, case-insensitive; "" = any
  std::vector<std::string> filters;  // each must be a tag, the model_type, library_name or pipeline_tag
  std::string pipeline_tag;          // "" = any
  std::string library;               // "" = any
  std::optional<bool> gated;         // only gated / only not gated
  SortKey sort = SortKey::kDownloads;
  bool descending = true;
  int64_t limit = 1000;  // >= 1
  std::optional<Cursor> cursor;
};

class Catalog {
 public:
  virtual ~Catalog() = default;

  virtual int64_t size() const = 0;
  virtual ModelRecord Record(int64_t index) const = 0;  // index < size()
  virtual std::string IdAt(int64_t index) const = 0;    // Record(index).id, cheaper
  virtual std::optional<int64_t> Find(std::string_view id) const = 0;
  // The exact config.json bytes, nullopt when the model has none.
  virtual std::optional<std::string> ConfigBytes(int64_t index) const = 0;
  // Where a legacy (renamed) id now lives, if it is one.
  virtual std::optional<std::string> RedirectTarget(std::string_view /*id*/) const { return std::nullopt; }

  // Whether `key` has a rank order, and the model at `rank` in it (rank 0 =
  // the largest key; ties in a fixed order).
  virtual bool HasRankOrder(SortKey key) const = 0;
  virtual int64_t IndexAtRank(SortKey key, int64_t rank) const = 0;
  // For orders without a rank order: a byte-wise comparable key (ties are
  // broken by index).
  virtual std::string ScanKey(SortKey key, int64_t index) const = 0;

  // Whether model `index` passes the query's filters: always the answer of
  // hub_replay::Matches(Record(index), query), which is what this default
  // computes; a catalog may answer it more cheaply.
  virtual bool Matches(int64_t index, const ListQuery& query) const;
};

struct ListPage {
  std::vector<ModelRecord> models;
  std::optional<Cursor> next;  // set when more matching models exist
};

// The filter semantics (see ListQuery); every Catalog::Matches agrees with it.
bool Matches(const ModelRecord& model, const ListQuery& query);

// One page of the listing. InvalidArgument when the cursor belongs to another
// sort or direction or points outside the catalog.
Result<ListPage> RunListQuery(const Catalog& catalog, const ListQuery& query);

// A list entry in wire form: the default fields, plus author, sha,
// lastModified, gated and disabled when `full`, plus the trimmed config when
// `config`.
nlohmann::ordered_json EntryJson(const ModelRecord& model, bool full, bool config);

// The transformers pipeline task an architecture class name implies (e.g.
// LlamaForCausalLM -> text-generation), "" when none does. A heuristic after
// transformers' task-to-class naming, used where a record has no pipeline_tag.
std::string PipelineTagFor(const std::string& architecture, const std::string& model_type);

// One parsed line of configs.jsonl.
struct ConfigEntry {
  std::string id;
  std::string bytes;              // the config serialised with 2-space indent and a final newline
  nlohmann::ordered_json subset;  // architectures / model_type, or null
  std::string architecture;       // first architecture, "" if none
  std::string model_type;         // "" if none
  std::string revision;           // "" if the line has none
};
Result<std::vector<ConfigEntry>> LoadConfigsJsonl(const std::string& path);

// "2025-03-02 13:05:55+00:00" (the Python client's form) -> "2025-03-02T13:05:55.000Z";
// strings already in wire form are returned as they are.
std::string NormalizeTimestamp(const std::string& text);
// Milliseconds since the epoch -> "2025-03-02T13:05:55.123Z".
std::string FormatTimestamp(int64_t epoch_ms);

std::string ToLower(std::string_view text);

}  // namespace coverage::hub_replay
