// The real recorded Hub data as a Catalog: data/hub/models.jsonl (trimmed
// real API records), data/hub/configs.jsonl (real config.json objects) and
// data/hub/redirects.json (recorded 307s of legacy ids). See data/hub/README.md.
//
// The models are the union of the records and the configs' ids. An id with
// only a config gets: author = its namespace, createdAt = lastModified = the
// Hub's earliest createdAt (2022-03-02T23:29:04.000Z), sha = the line's
// `revision` when it is a 40-hex commit, otherwise derived from the id;
// `_id` derived from the id; downloads = likes = 0; tags = ["transformers",
// model_type]; library_name "transformers"; pipeline_tag from the
// architecture (PipelineTagFor). A record without a config in configs.jsonl
// has no config.json (EntryNotFound). Every order is a rank order.
#pragma once

#include <memory>
#include <string>

#include "core/result.h"
#include "tools/hub-replay/catalog.h"

namespace coverage::hub_replay {

// Errors: IoError when a file cannot be read, Corruption (naming file:line)
// when a line does not parse or lacks a field, InvalidArgument for an id
// that breaks the Hub's id rules.
Result<std::unique_ptr<Catalog>> LoadRealCatalog(const std::string& data_dir);

// The Hub's id rules, simplified (see crawler/model_id.h for the full ones):
// ASCII letters, digits, '_', '-', '.', at most one '/', non-empty parts that
// start and end with a letter, digit or '_', names of at most 96 characters,
// no "--" or "..", no ".git" suffix. Used on every id taken from a request path.
bool IsPlausibleModelId(std::string_view id);

}  // namespace coverage::hub_replay
