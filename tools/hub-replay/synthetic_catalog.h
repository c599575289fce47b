// A synthetic hub of N models derived from the real configs, computed lazily:
// every field of model i is a pure function of (seed, i) evaluated in O(1),
// so memory does not grow with N beyond the table of base configs.
//
// How a synthetic hub is derived (Note [Synthetic hub]; figures from
// shared/data/hub/STATS.md):
// - Base: each model derives from one real config of configs.jsonl, picked
//   uniformly, so the model_type mix is the mix of the real configs; many
//   models share a base.
// - Relation to the base, in the Hub's measured mix of base_model relations:
//   finetune 35.91%, adapter 42.57%, quantized 19.22%, merge 2.30%.
//   Adapters have no config.json (EntryNotFound; library "peft"). Fine-tunes
//   (25%) and merges (50%) vary one number (vocab_size + 64·k for added
//   tokens, or max_position_embeddings × 2), which makes distinct fine
//   signatures; quantized models add a quantization_config block
//   (gptq / awq / bitsandbytes) unless the base has one. The rest serve the
//   base config unchanged.
// - Id: "{author}/{base name, ≤ 60 chars}-{variant}-{code}", code = 8
//   base-36 digits of a keyed bijection of i, so ids are unique, valid under
//   the Hub's rules, and Find() inverts them in O(1). Authors are generated
//   names; author popularity is skewed (author = ⌊A·u²⌋ of A = N/4).
// - downloads = ⌊129,917,294 · (r+1)^-α⌋ for download rank r (the top value is
//   all-MiniLM-L6-v2's 30-day count), α chosen so 35.5% of models have
//   downloads > 0 (hub-stats dump, Oct 2025); at N = 2M the 50 most
//   downloaded hold ~80% of downloads, as published. Rank -> model is a keyed
//   bijection, so sort=downloads walks the ranks in O(1) per model.
// - likes: the same law on an independent rank: top 11,967 and 13.5% > 0 (the
//   metadata sample's max and share).
// - createdAt grows with i: the first 1.5% share the Hub's earliest value
//   (legacy models), the rest spread to 2026-05-01 with 80× exponential
//   growth (≈35K models in 2022-04 to ≈2.9M in 2026-05), so sort=createdAt
//   is a rank order too. lastModified lies between createdAt and 2026-05-01.
// - gated: 2.37% "auto", 0.81% "manual" (the metadata sample's shares).
// sort=lastModified and sort=id are computed by a scan over all N models.
#pragma once

#include <memory>
#include <vector>

#include "core/result.h"
#include "tools/hub-replay/catalog.h"

namespace coverage::hub_replay {

// The largest synthetic hub (the id code holds 40 bits).
constexpr int64_t kMaxSyntheticModels = int64_t{1} << 40;

// `bases` are the real configs (LoadConfigsJsonl), at least one;
// 1 <= models <= kMaxSyntheticModels. Errors: InvalidArgument.
Result<std::unique_ptr<Catalog>> MakeSyntheticCatalog(const std::vector<ConfigEntry>& bases, int64_t models,
                                                      uint64_t seed);

}  // namespace coverage::hub_replay
