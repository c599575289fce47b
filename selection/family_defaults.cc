// FamilyDefaults (the defaults and alias maps of the model types transformers
// knows) and the names that lead to a family: model types, legacy names and
// architecture classes.
#include <algorithm>
#include <cctype>
#include <fstream>
#include <nlohmann/json.hpp>
#include <unordered_map>
#include <utility>

#include "core/json_capped.h"
#include "selection/config_reader.h"
#include "selection/extract.h"
#include "selection/feature_tables.h"
#include "selection/features.h"

namespace coverage::selection {
namespace detail {
namespace {

// Architecture names of TF and Flax classes carry a framework prefix.
std::string_view StripFramework(std::string_view architecture) {
  for (std::string_view prefix : {std::string_view("TF"), std::string_view("Flax")}) {
    if (architecture.size() > prefix.size() + 1 && StartsWith(architecture, prefix) &&
        std::isupper(static_cast<unsigned char>(architecture[prefix.size()]))) {
      return architecture.substr(prefix.size());
    }
  }
  return architecture;
}

const Names kHeadStarts = {"For",     "Model",   "LMHead",   "WithLMHead",     "MTModel",
                           "Encoder", "Decoder", "Backbone", "PreTrainedModel"};

bool StartsWithHead(std::string_view rest) {
  return std::any_of(kHeadStarts.begin(), kHeadStarts.end(), [&](std::string_view h) { return StartsWith(rest, h); });
}

}  // namespace

const Family* FindFamily(const FamilyDefaults& defaults, std::string_view model_type) {
  if (model_type.empty()) return nullptr;
  if (const Family* f = defaults.Find(model_type)) return f;
  std::string lower = Lower(model_type);
  if (const Family* f = defaults.Find(lower)) return f;
  std::string swapped = lower;
  for (char& c : swapped) c = c == '-' ? '_' : c == '_' ? '-' : c;
  if (const Family* f = defaults.Find(swapped)) return f;
  for (const auto& [legacy, family] : Tables().legacy_model_types) {
    if (lower == legacy) return defaults.Find(family);
  }
  return nullptr;
}

const Family* FamilyFromArchitecture(const FamilyDefaults& defaults, std::string_view architecture) {
  std::string_view name = StripFramework(architecture);
  for (const auto& [prefix, family] : Tables().legacy_architecture_prefixes) {
    if (StartsWith(name, prefix) && StartsWithHead(name.substr(prefix.size()))) return defaults.Find(family);
  }
  return defaults.FindByArchitecture(name);
}

std::string HeadOf(std::string_view architecture, const Family* family) {
  std::string_view name = StripFramework(architecture);
  if (family != nullptr) {
    std::string_view cls = family->config_class;
    if (cls.size() > 6 && cls.substr(cls.size() - 6) == "Config") {
      std::string prefix = Lower(cls.substr(0, cls.size() - 6));
      if (name.size() > prefix.size() && Lower(name.substr(0, prefix.size())) == prefix &&
          StartsWithHead(name.substr(prefix.size()))) {
        return std::string(name.substr(prefix.size()));
      }
    }
  }
  for (size_t i = 1; i + 3 < name.size(); ++i) {
    if (name.substr(i, 3) == "For" && std::isupper(static_cast<unsigned char>(name[i + 3]))) {
      return std::string(name.substr(i));
    }
  }
  for (std::string_view suffix :
       {"WithLMHeadModel", "LMHeadModel", "MTModel", "EncoderModel", "DecoderModel", "Model", "Encoder", "Decoder"}) {
    if (name.size() >= suffix.size() && name.substr(name.size() - suffix.size()) == suffix) return std::string(suffix);
  }
  return "";
}

}  // namespace detail

using detail::Family;
using detail::json;
using detail::Lower;
using detail::Member;
using detail::StartsWith;
using detail::StartsWithHead;
using detail::StripFramework;

// ---------------------------------------------------------------------------
// FamilyDefaults.

struct FamilyDefaults::Impl {
  std::vector<Family> families;  // every line, in file order; never resized after Load
  std::unordered_map<std::string, size_t> by_type;
  std::unordered_map<std::string, size_t> by_class;
  // Lowercased architecture prefixes ("albert"), longest first.
  std::vector<std::pair<std::string, size_t>> prefixes;
};

FamilyDefaults::FamilyDefaults() : impl_(std::make_unique<Impl>()) {}
FamilyDefaults::~FamilyDefaults() = default;

std::shared_ptr<const FamilyDefaults> FamilyDefaults::Empty() {
  return std::shared_ptr<const FamilyDefaults>(new FamilyDefaults());
}

namespace {

Result<Family> ParseFamilyLine(const json& line) {
  if (!line.is_object()) return Status::InvalidArgument("expected a JSON object");
  Family family;
  const json* type = Member(&line, "model_type");
  if (type == nullptr || !(type->is_null() || type->is_string())) {
    return Status::InvalidArgument("model_type: expected a string or null");
  }
  if (type->is_string()) family.model_type = type->get<std::string>();
  const json* cls = Member(&line, "config_class");
  if (cls == nullptr || !cls->is_string() || cls->get_ref<const std::string&>().empty()) {
    return Status::InvalidArgument("config_class: expected a non-empty string");
  }
  family.config_class = cls->get<std::string>();
  const json* defaults = Member(&line, "defaults");
  if (defaults != nullptr && !defaults->is_null() && !defaults->is_object()) {
    return Status::InvalidArgument("defaults: expected an object or null");
  }
  family.defaults =
      std::make_shared<const json>(defaults != nullptr && defaults->is_object() ? *defaults : json::object());
  if (const json* map = Member(&line, "attribute_map"); map != nullptr && !map->is_null()) {
    if (!map->is_object()) return Status::InvalidArgument("attribute_map: expected an object or null");
    for (const auto& [alias, field] : map->items()) {
      if (!field.is_string()) return Status::InvalidArgument("attribute_map." + alias + ": expected a string");
      family.attribute_map[alias] = field.get<std::string>();
    }
  }
  if (const json* subs = Member(&line, "sub_configs"); subs != nullptr && !subs->is_null()) {
    if (!subs->is_array()) return Status::InvalidArgument("sub_configs: expected a list or null");
    for (const json& s : *subs) {
      if (!s.is_string()) return Status::InvalidArgument("sub_configs: expected a list of strings");
      family.sub_configs.push_back(s.get<std::string>());
    }
  }
  if (const json* classes = Member(&line, "sub_config_classes"); classes != nullptr && !classes->is_null()) {
    if (!classes->is_object()) return Status::InvalidArgument("sub_config_classes: expected an object or null");
    for (const auto& [key, value] : classes->items()) {
      // Values are source expressions; only a plain class name is usable.
      if (value.is_string()) family.sub_config_classes[key] = value.get<std::string>();
    }
  }
  return family;
}

}  // namespace

Result<std::shared_ptr<const FamilyDefaults>> FamilyDefaults::Load(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::IoError(path + ": cannot open for reading");
  std::shared_ptr<FamilyDefaults> table(new FamilyDefaults());
  Impl& impl = *table->impl_;
  std::string text;
  for (int line_no = 1; std::getline(in, text); ++line_no) {
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(line_no);
    auto parsed = ParseJsonCapped(text);
    if (!parsed) return Status::InvalidArgument(where + ": " + parsed.error().message());
    auto family = ParseFamilyLine(*parsed);
    if (!family) return Status::InvalidArgument(where + ": " + family.error().message());
    impl.families.push_back(std::move(*family));
  }
  if (in.bad()) return Status::IoError(path + ": read failed");
  for (size_t i = 0; i < impl.families.size(); ++i) {
    const Family& family = impl.families[i];
    if (!family.model_type.empty()) impl.by_type.emplace(family.model_type, i);
    impl.by_class.emplace(family.config_class, i);
    const std::string_view cls = family.config_class;
    if (!family.model_type.empty() && cls.size() > 6 && cls.substr(cls.size() - 6) == "Config") {
      impl.prefixes.emplace_back(Lower(cls.substr(0, cls.size() - 6)), i);
    }
  }
  std::stable_sort(impl.prefixes.begin(), impl.prefixes.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  return std::shared_ptr<const FamilyDefaults>(std::move(table));
}

const FamilyDefaults::Family* FamilyDefaults::Find(std::string_view model_type) const {
  auto it = impl_->by_type.find(std::string(model_type));
  return it == impl_->by_type.end() ? nullptr : &impl_->families[it->second];
}

const FamilyDefaults::Family* FamilyDefaults::FindByConfigClass(std::string_view config_class) const {
  auto it = impl_->by_class.find(std::string(config_class));
  return it == impl_->by_class.end() ? nullptr : &impl_->families[it->second];
}

const FamilyDefaults::Family* FamilyDefaults::FindByArchitecture(std::string_view architecture) const {
  const std::string_view name = StripFramework(architecture);
  const std::string lower = Lower(name);
  for (const auto& [prefix, index] : impl_->prefixes) {
    if (lower.size() > prefix.size() && StartsWith(lower, prefix) && StartsWithHead(name.substr(prefix.size()))) {
      return &impl_->families[index];
    }
  }
  return nullptr;
}

size_t FamilyDefaults::size() const { return impl_->by_type.size(); }

}  // namespace coverage::selection
