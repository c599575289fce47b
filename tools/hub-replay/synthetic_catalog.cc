#include "tools/hub-replay/synthetic_catalog.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "core/check.h"
#include "tools/hub-replay/json_text.h"
#include "tools/hub-replay/permutation.h"

namespace coverage::hub_replay {
namespace {

// See Note [Synthetic hub] in synthetic_catalog.h for where each figure comes from.
constexpr double kTopDownloads = 129917294;  // sentence-transformers/all-MiniLM-L6-v2, 30 days
constexpr double kShareWithDownloads = 0.355;
constexpr double kTopLikes = 11967;
constexpr double kShareWithLikes = 0.135;
constexpr double kShareFinetune = 0.3591, kShareAdapter = 0.4257, kShareQuantized = 0.1922;  // merge: the rest
constexpr double kShareGatedAuto = 0.0237, kShareGatedManual = 0.0081;
constexpr double kShareLegacy = 0.015;
constexpr double kGrowth = 80;
constexpr int64_t kEarliestMs = 1646263744000;  // 2022-03-02T23:29:04.000Z
constexpr int64_t kEndMs = 1777593600000;       // 2026-05-01T00:00:00.000Z
constexpr size_t kMaxStem = 60;
constexpr int kCodeDigits = 8;  // 36^8 > 2^40

enum class Relation { kFinetune, kAdapter, kQuantized, kMerge };

const char* RelationTag(Relation r) {
  switch (r) {
    case Relation::kFinetune:
      return "finetune";
    case Relation::kAdapter:
      return "adapter";
    case Relation::kQuantized:
      return "quantized";
    case Relation::kMerge:
      return "merge";
  }
  return "finetune";
}

const std::vector<const char*>& Variants(Relation r) {
  static const std::vector<const char*> kFinetune = {"sft",  "dpo", "instruct", "chat", "ft",
                                                     "orpo", "v2",  "it",       "grpo", "finetuned"};
  static const std::vector<const char*> kAdapter = {"lora", "qlora", "adapter", "peft-lora"};
  static const std::vector<const char*> kQuantized = {"GPTQ", "AWQ", "bnb-4bit", "8bit"};  // see QuantizationConfig
  static const std::vector<const char*> kMerge = {"merge", "slerp", "ties", "dare-ties"};
  switch (r) {
    case Relation::kFinetune:
      return kFinetune;
    case Relation::kAdapter:
      return kAdapter;
    case Relation::kQuantized:
      return kQuantized;
    case Relation::kMerge:
      return kMerge;
  }
  return kFinetune;
}

// The quantization_config block transformers writes for each quantized variant.
nlohmann::ordered_json QuantizationConfig(int variant) {
  nlohmann::ordered_json q;
  switch (variant) {
    case 0:
      q = {{"bits", 4}, {"group_size", 128}, {"desc_act", false}, {"sym", true}, {"quant_method", "gptq"}};
      break;
    case 1:
      q = {{"bits", 4}, {"group_size", 128}, {"quant_method", "awq"}, {"version", "gemm"}, {"zero_point", true}};
      break;
    case 2:
      q = {{"bnb_4bit_compute_dtype", "bfloat16"},
           {"bnb_4bit_quant_type", "nf4"},
           {"load_in_4bit", true},
           {"load_in_8bit", false},
           {"quant_method", "bitsandbytes"}};
      break;
    default:
      q = {{"load_in_4bit", false}, {"load_in_8bit", true}, {"quant_method", "bitsandbytes"}};
      break;
  }
  return q;
}

const char* QuantizationTag(int variant) {
  static const char* const kTags[] = {"gptq", "awq", "bitsandbytes", "bitsandbytes"};
  return kTags[variant & 3];
}

bool IsWordChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

// In Reindent output a top-level member is the line `\n  "key": value`; nested
// members are indented further, so they never match.
bool ReplaceTopLevelInt(std::string& bytes, std::string_view key, const std::function<int64_t(int64_t)>& change) {
  const std::string needle = "\n  \"" + std::string(key) + "\": ";
  const size_t at = bytes.find(needle);
  if (at == std::string::npos) return false;
  const size_t start = at + needle.size();
  size_t end = start;
  while (end < bytes.size() && bytes[end] >= '0' && bytes[end] <= '9') ++end;
  if (end == start || end - start > 15 || (end < bytes.size() && bytes[end] != ',' && bytes[end] != '\n')) return false;
  const int64_t value = std::stoll(bytes.substr(start, end - start));
  bytes.replace(start, end - start, std::to_string(change(value)));
  return true;
}

// Adds `"key": value` as the last member of the top-level object.
void AppendTopLevelMember(std::string& bytes, std::string_view key, const nlohmann::ordered_json& value) {
  const size_t close = bytes.rfind("\n}");
  if (close == std::string::npos) return;
  Result<std::string> text = Reindent(value.dump());
  if (!text) return;
  std::string member = ",\n  \"" + std::string(key) + "\": ";
  for (char c : *text) {
    member += c;
    if (c == '\n') member += "  ";
  }
  bytes.insert(close, member);
}

std::string Base36(uint64_t v) {
  static const char kDigits[] = "0123456789abcdefghijklmnopqrstuvwxyz";
  std::string out(kCodeDigits, '0');
  for (int i = kCodeDigits - 1; i >= 0; --i, v /= 36) out[static_cast<size_t>(i)] = kDigits[v % 36];
  return out;
}

std::optional<uint64_t> ParseBase36(std::string_view s) {
  if (s.size() != kCodeDigits) return std::nullopt;
  uint64_t v = 0;
  for (char c : s) {
    int d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'a' && c <= 'z') {
      d = c - 'a' + 10;
    } else {
      return std::nullopt;
    }
    v = v * 36 + static_cast<uint64_t>(d);
  }
  return v;
}

struct Base {
  std::string id;
  std::string stem;  // name part for derived ids: at most kMaxStem chars, ends with a word char
  std::string model_type;
  std::string pipeline_tag;
  nlohmann::ordered_json subset;
  std::string bytes;
  bool has_quantization_config = false;
};

// Salts of the independent per-model streams.
enum Salt : uint64_t {
  kSaltBase = 1,
  kSaltRelation,
  kSaltVariant,
  kSaltAuthor,
  kSaltGated,
  kSaltModified,
  kSaltTweak,
  kSaltTweakSize,
  kSaltSha1,
  kSaltSha2,
  kSaltSha3,
  kSaltObjectId,
  kSaltAuthorName,
  kSaltAuthorSuffix,
  kSaltCode,
  kSaltDownloads,
  kSaltLikes,
};

struct Traits {
  const Base* base;
  Relation relation;
  int variant;
  int64_t author;
};

constexpr Relation kRelations[] = {Relation::kFinetune, Relation::kAdapter, Relation::kQuantized, Relation::kMerge};
constexpr size_t kProfilesPerBase = 22;  // the variants of all four relations

size_t ProfileSlot(Relation relation, int variant) {
  size_t slot = 0;
  for (Relation r : kRelations) {
    if (r == relation) break;
    slot += Variants(r).size();
  }
  return slot + static_cast<size_t>(variant);
}

// What a model's tags and library are, given its base, relation and variant.
struct Profile {
  std::string library_name;
  std::vector<std::string> tags;
};

std::vector<Profile> MakeProfiles(const std::vector<Base>& bases) {
  COV_CHECK(
      ProfileSlot(Relation::kMerge, static_cast<int>(Variants(Relation::kMerge).size()) - 1) + 1 == kProfilesPerBase,
      "kProfilesPerBase must equal the number of variants");
  std::vector<Profile> profiles(bases.size() * kProfilesPerBase);
  for (size_t b = 0; b < bases.size(); ++b) {
    const Base& base = bases[b];
    for (Relation relation : kRelations) {
      for (size_t v = 0; v < Variants(relation).size(); ++v) {
        Profile& p = profiles[b * kProfilesPerBase + ProfileSlot(relation, static_cast<int>(v))];
        p.library_name = relation == Relation::kAdapter ? "peft" : "transformers";
        p.tags.push_back(p.library_name);
        if (relation != Relation::kAdapter) p.tags.push_back("safetensors");
        if (!base.model_type.empty()) p.tags.push_back(base.model_type);
        if (!base.pipeline_tag.empty()) p.tags.push_back(base.pipeline_tag);
        if (relation == Relation::kAdapter) p.tags.push_back("lora");
        if (relation == Relation::kQuantized) {
          p.tags.push_back(v == 3 ? "8-bit" : "4-bit");
          p.tags.push_back(QuantizationTag(static_cast<int>(v)));
        }
        if (relation == Relation::kMerge) {
          p.tags.push_back("mergekit");
          p.tags.push_back("merge");
        }
        p.tags.push_back("base_model:" + base.id);
        p.tags.push_back(std::string("base_model:") + RelationTag(relation) + ":" + base.id);
        p.tags.push_back("region:us");
      }
    }
  }
  return profiles;
}

class SyntheticCatalog final : public Catalog {
 public:
  SyntheticCatalog(std::vector<Base> bases, int64_t n, uint64_t seed)
      : bases_(std::move(bases)),
        profiles_(MakeProfiles(bases_)),
        n_(n),
        seed_(seed),
        authors_(std::max<int64_t>(16, n / 4)),
        code_(uint64_t{1} << 40, HashOf(seed, 0, kSaltCode)),
        by_downloads_(static_cast<uint64_t>(n), HashOf(seed, 0, kSaltDownloads)),
        by_likes_(static_cast<uint64_t>(n), HashOf(seed, 0, kSaltLikes)),
        downloads_alpha_(std::log(kTopDownloads) /
                         std::log(std::max(2.0, kShareWithDownloads * static_cast<double>(n)))),
        likes_alpha_(std::log(kTopLikes) / std::log(std::max(2.0, kShareWithLikes * static_cast<double>(n)))) {}

  int64_t size() const override { return n_; }

  std::string IdAt(int64_t index) const override { return IdOf(index, TraitsOf(index)); }

  std::optional<int64_t> Find(std::string_view id) const override {
    const size_t dash = id.rfind('-');
    if (dash == std::string_view::npos) return std::nullopt;
    const std::optional<uint64_t> code = ParseBase36(id.substr(dash + 1));
    if (!code || *code >= code_.size()) return std::nullopt;
    const uint64_t index = code_.Inverse(*code);
    if (index >= static_cast<uint64_t>(n_)) return std::nullopt;
    if (IdAt(static_cast<int64_t>(index)) != id) return std::nullopt;
    return static_cast<int64_t>(index);
  }

  ModelRecord Record(int64_t i) const override {
    const Traits t = TraitsOf(i);
    const Base& base = *t.base;
    ModelRecord m;
    m.id = IdOf(i, t);
    m.author = AuthorName(t.author);
    const int64_t created = CreatedMs(i);
    m.mongo_id = HexDigits(static_cast<uint64_t>(created / 1000), 8) + HexDigits(Hash(i, kSaltObjectId), 16);
    m.sha = HexDigits(Hash(i, kSaltSha1), 16) + HexDigits(Hash(i, kSaltSha2), 16) + HexDigits(Hash(i, kSaltSha3), 8);
    m.created_at = FormatTimestamp(created);
    m.last_modified = FormatTimestamp(LastModifiedMs(i, created));
    m.gated = GatedOf(i);
    m.downloads = Downloads(i);
    m.likes = Likes(i);
    const Profile& profile = ProfileOf(t);
    m.library_name = profile.library_name;
    m.pipeline_tag = base.pipeline_tag;
    m.has_config_file = t.relation != Relation::kAdapter;
    m.config_subset = base.subset;
    m.tags = profile.tags;
    return m;
  }

  std::optional<std::string> ConfigBytes(int64_t i) const override {
    const Traits t = TraitsOf(i);
    if (t.relation == Relation::kAdapter) return std::nullopt;
    const Base& base = *t.base;
    const double tweak = UnitInterval(Hash(i, kSaltTweak));
    const bool vary =
        (t.relation == Relation::kFinetune && tweak < 0.25) || (t.relation == Relation::kMerge && tweak < 0.5);
    const bool quantize = t.relation == Relation::kQuantized && !base.has_quantization_config;
    std::string bytes = base.bytes;
    // Edits are made on the text, so every other byte (Infinity literals
    // included) stays as the real config has it.
    if (vary) {
      const int64_t added_tokens = 64 * static_cast<int64_t>(1 + Hash(i, kSaltTweakSize) % 16);
      if (!ReplaceTopLevelInt(bytes, "vocab_size", [&](int64_t v) { return v + added_tokens; })) {
        ReplaceTopLevelInt(bytes, "max_position_embeddings", [](int64_t v) { return v * 2; });
      }
    }
    if (quantize) AppendTopLevelMember(bytes, "quantization_config", QuantizationConfig(t.variant));
    return bytes;
  }

  bool HasRankOrder(SortKey key) const override {
    return key == SortKey::kDownloads || key == SortKey::kLikes || key == SortKey::kCreatedAt;
  }

  int64_t IndexAtRank(SortKey key, int64_t rank) const override {
    switch (key) {
      case SortKey::kDownloads:
        return static_cast<int64_t>(by_downloads_.Forward(static_cast<uint64_t>(rank)));
      case SortKey::kLikes:
        return static_cast<int64_t>(by_likes_.Forward(static_cast<uint64_t>(rank)));
      default:
        return n_ - 1 - rank;  // kCreatedAt: creation time grows with the index
    }
  }

  std::string ScanKey(SortKey key, int64_t index) const override {
    if (key == SortKey::kLastModified) return FormatTimestamp(LastModifiedMs(index, CreatedMs(index)));
    return IdAt(index);
  }

  // hub_replay::Matches without building the record: tags, library and
  // pipeline come from the model's profile table entry, and the id and
  // author are only made when the query asks about them.
  bool Matches(int64_t i, const ListQuery& q) const override {
    const Traits t = TraitsOf(i);
    const Profile& profile = ProfileOf(t);
    const Base& base = *t.base;
    if (q.gated && GatedOf(i).empty() == *q.gated) return false;
    if (!q.pipeline_tag.empty() && base.pipeline_tag != q.pipeline_tag) return false;
    if (!q.library.empty() && profile.library_name != q.library) return false;
    for (const std::string& f : q.filters) {
      const bool hit = f == base.model_type || f == profile.library_name || f == base.pipeline_tag ||
                       std::find(profile.tags.begin(), profile.tags.end(), f) != profile.tags.end();
      if (!hit) return false;
    }
    if (!q.author.empty() && ToLower(AuthorName(t.author)) != q.author) return false;
    if (!q.search.empty()) {
      const std::string id = ToLower(IdOf(i, t));
      for (const std::string& s : q.search) {
        if (id.find(s) == std::string::npos) return false;
      }
    }
    return true;
  }

 private:
  uint64_t Hash(int64_t i, uint64_t salt) const { return HashOf(seed_, static_cast<uint64_t>(i), salt); }

  // Tags and library depend only on (base, relation, variant): one table entry each.
  const Profile& ProfileOf(const Traits& t) const {
    const size_t base = static_cast<size_t>(t.base - bases_.data());
    return profiles_[base * kProfilesPerBase + ProfileSlot(t.relation, t.variant)];
  }

  std::string GatedOf(int64_t i) const {
    const double g = UnitInterval(Hash(i, kSaltGated));
    if (g < kShareGatedAuto) return "auto";
    if (g < kShareGatedAuto + kShareGatedManual) return "manual";
    return "";
  }

  Traits TraitsOf(int64_t i) const {
    Traits t;
    t.base = &bases_[Hash(i, kSaltBase) % bases_.size()];
    const double r = UnitInterval(Hash(i, kSaltRelation));
    t.relation = r < kShareFinetune                                     ? Relation::kFinetune
                 : r < kShareFinetune + kShareAdapter                   ? Relation::kAdapter
                 : r < kShareFinetune + kShareAdapter + kShareQuantized ? Relation::kQuantized
                                                                        : Relation::kMerge;
    t.variant = static_cast<int>(Hash(i, kSaltVariant) % Variants(t.relation).size());
    const double u = UnitInterval(Hash(i, kSaltAuthor));
    t.author = std::min<int64_t>(authors_ - 1, static_cast<int64_t>(static_cast<double>(authors_) * u * u));
    return t;
  }

  std::string IdOf(int64_t i, const Traits& t) const {
    return AuthorName(t.author) + "/" + t.base->stem + "-" + Variants(t.relation)[static_cast<size_t>(t.variant)] +
           "-" + Base36(code_.Forward(static_cast<uint64_t>(i)));
  }

  // Pronounceable names: 2-4 syllables, some capitalised, some with digits or an org-like suffix.
  std::string AuthorName(int64_t a) const {
    static const char* const kOnsets[] = {"b", "c", "d", "f", "g", "h",  "j",  "k",  "l",  "m",  "n",  "p", "r",
                                          "s", "t", "v", "w", "z", "ch", "sh", "th", "st", "br", "tr", "kr"};
    static const char* const kVowels[] = {"a", "e", "i", "o", "u", "ai", "ei", "ou", "ia", "y"};
    uint64_t h = HashOf(seed_, static_cast<uint64_t>(a), kSaltAuthorName);
    std::string name;
    const int syllables = 2 + static_cast<int>(h % 3);
    h /= 3;
    for (int s = 0; s < syllables; ++s) {
      name += kOnsets[h % 25];
      h /= 25;
      name += kVowels[h % 10];
      h /= 10;
    }
    if (h % 10 < 3) name[0] = static_cast<char>(name[0] - 'a' + 'A');
    const uint64_t suffix = HashOf(seed_, static_cast<uint64_t>(a), kSaltAuthorSuffix) % 10;
    if (suffix < 4) {
      name += std::to_string(a % 10000);
    } else if (suffix == 4) {
      name += "-ai";
    } else if (suffix == 5) {
      name += "-labs";
    } else if (suffix == 6) {
      name += "_ml";
    }
    return name;
  }

  int64_t CreatedMs(int64_t i) const {
    const double f = (static_cast<double>(i) + 0.5) / static_cast<double>(n_);
    if (f < kShareLegacy) return kEarliestMs;
    const double x = std::log1p((f - kShareLegacy) / (1 - kShareLegacy) * (kGrowth - 1)) / std::log(kGrowth);
    return kEarliestMs + static_cast<int64_t>(x * static_cast<double>(kEndMs - kEarliestMs));
  }

  int64_t LastModifiedMs(int64_t i, int64_t created) const {
    const double u = UnitInterval(Hash(i, kSaltModified));
    return created + static_cast<int64_t>(u * u * u * static_cast<double>(kEndMs - created));
  }

  int64_t Downloads(int64_t i) const {
    const double rank = static_cast<double>(by_downloads_.Inverse(static_cast<uint64_t>(i)));
    return static_cast<int64_t>(std::floor(kTopDownloads * std::pow(rank + 1, -downloads_alpha_)));
  }

  int64_t Likes(int64_t i) const {
    const double rank = static_cast<double>(by_likes_.Inverse(static_cast<uint64_t>(i)));
    return static_cast<int64_t>(std::floor(kTopLikes * std::pow(rank + 1, -likes_alpha_)));
  }

  std::vector<Base> bases_;
  std::vector<Profile> profiles_;
  int64_t n_;
  uint64_t seed_;
  int64_t authors_;
  IndexPermutation code_;          // model index -> id code, over 2^40 values
  IndexPermutation by_downloads_;  // download rank -> model index
  IndexPermutation by_likes_;      // likes rank -> model index
  double downloads_alpha_;
  double likes_alpha_;
};

}  // namespace

Result<std::unique_ptr<Catalog>> MakeSyntheticCatalog(const std::vector<ConfigEntry>& configs, int64_t models,
                                                      uint64_t seed) {
  if (models < 1 || models > kMaxSyntheticModels) {
    return Status::InvalidArgument("a synthetic hub holds 1 to " + std::to_string(kMaxSyntheticModels) +
                                   " models, not " + std::to_string(models));
  }
  if (configs.empty()) return Status::InvalidArgument("a synthetic hub needs at least one base config");
  std::vector<Base> bases;
  bases.reserve(configs.size());
  for (const ConfigEntry& c : configs) {
    Base b;
    b.id = c.id;
    const size_t slash = c.id.find('/');
    b.stem = c.id.substr(slash == std::string::npos ? 0 : slash + 1);
    if (b.stem.size() > kMaxStem) b.stem.resize(kMaxStem);
    while (!b.stem.empty() && !IsWordChar(b.stem.back())) b.stem.pop_back();
    if (b.stem.empty()) b.stem = "model";
    b.model_type = c.model_type;
    b.pipeline_tag = PipelineTagFor(c.architecture, c.model_type);
    b.subset = c.subset;
    b.bytes = c.bytes;
    b.has_quantization_config = c.bytes.find("\"quantization_config\"") != std::string::npos;
    bases.push_back(std::move(b));
  }
  return std::unique_ptr<Catalog>(std::make_unique<SyntheticCatalog>(std::move(bases), models, seed));
}

}  // namespace coverage::hub_replay
