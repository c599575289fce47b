#include "core/input_rules.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/json_fields.h"
#include "core/shipped_rules.h"

namespace coverage {
namespace {

using json = nlohmann::json;

// A size the rules read off the case: a dimension of a tensor argument, or
// an int argument's value.
struct SizeOf {
  std::string of;                  // the tensor whose dimension it is
  std::optional<int64_t> dim;      // that dimension (negative counts from the end)
  std::string dim_arg;             // ...or the int argument naming it (absent: 0)
  bool class_dim = false;          // ...or the class dimension: 1, or 0 for a 1-D tensor
  std::optional<int64_t> rank;     // applies only when `of` has this rank
  std::map<std::string, int64_t> ranks;  // ...and when these tensors have these ranks
  std::string int_arg;             // instead: this int argument's value (>= 0)
};

struct IndexRule {
  std::vector<std::string> args;  // the index tensor: the first of these present
  std::string list;               // or a tensor list whose i-th tensor indexes dimension i
  SizeOf size;                    // the indexed dimension (of, dim / dim_arg / class_dim)
  bool negative = false;          // [-size, size) where the recorded range had negatives
};

struct ValuesRule {
  StructuredValues::Kind kind = StructuredValues::Kind::kNone;
  std::string arg;
  std::vector<SizeOf> total;  // offsets, lengths: the first that applies
  bool first_zero = false;
  bool last_total = false;
  std::string last_total_if;  // a bool argument that, when true, pins the last offset
  std::string plane;          // distinct indices: the int-list argument giving the plane
};

struct OpRules {
  std::optional<IndexRule> index;
  std::vector<ValuesRule> values;
};

struct RuleTable {
  std::map<std::string, OpRules, std::less<>> ops;
  std::map<std::string, json, std::less<>> raw;  // each op's "inputs" as written
};

Status ReadSize(const json& j, const std::string& what, SizeOf* out) {
  const JsonFields f(j, what);
  COV_RETURN_IF_ERROR(f.OnlyMembers({"of", "dim", "dim_arg", "rank", "ranks", "int_arg"}));
  COV_RETURN_IF_ERROR(f.String("int_arg", &out->int_arg));
  COV_RETURN_IF_ERROR(f.String("of", &out->of));
  if (out->int_arg.empty() == out->of.empty()) return Status::Corruption(what + ": give one of 'of' and 'int_arg'");
  if (const json* dim = f.Find("dim"); dim && dim->is_string()) {
    if (dim->get<std::string>() != "class") return f.Error("dim", "expected an integer or \"class\"");
    out->class_dim = true;
  } else {
    int64_t d = 0;
    COV_RETURN_IF_ERROR(f.Int("dim", &d));
    if (dim) out->dim = d;
  }
  COV_RETURN_IF_ERROR(f.String("dim_arg", &out->dim_arg));
  int64_t rank = -1;
  COV_RETURN_IF_ERROR(f.Int("rank", &rank, int64_t{0}, int64_t{64}));
  if (rank >= 0) out->rank = rank;
  if (const json* ranks = f.Find("ranks")) {
    const JsonFields r = f.Sub("ranks", *ranks);
    if (!ranks->is_object()) return f.Error("ranks", "expected an object of tensor names to ranks");
    for (const auto& [name, v] : ranks->items()) {
      int64_t n = 0;
      COV_RETURN_IF_ERROR(r.Int(name.c_str(), &n, int64_t{0}, int64_t{64}));
      out->ranks[name] = n;
    }
  }
  return Status::Ok();
}

Status ReadSizes(const json& j, const std::string& what, std::vector<SizeOf>* out) {
  if (j.is_array()) {
    for (size_t i = 0; i < j.size(); ++i) {
      SizeOf s;
      COV_RETURN_IF_ERROR(ReadSize(j[i], what + "[" + std::to_string(i) + "]", &s));
      out->push_back(std::move(s));
    }
    if (out->empty()) return Status::Corruption(what + ": an empty list");
    return Status::Ok();
  }
  SizeOf s;
  COV_RETURN_IF_ERROR(ReadSize(j, what, &s));
  out->push_back(std::move(s));
  return Status::Ok();
}

Status ReadIndexRule(const json& j, const std::string& what, IndexRule* out) {
  const JsonFields f(j, what);
  COV_RETURN_IF_ERROR(f.OnlyMembers({"arg", "list", "of", "dim", "dim_arg", "negative"}));
  if (const json* arg = f.Find("arg"); arg && arg->is_string()) {
    out->args = {arg->get<std::string>()};
  } else {
    COV_RETURN_IF_ERROR(f.Strings("arg", &out->args));
  }
  COV_RETURN_IF_ERROR(f.String("list", &out->list));
  if (out->args.empty() == out->list.empty()) return Status::Corruption(what + ": give one of 'arg' and 'list'");
  COV_RETURN_IF_ERROR(f.Bool("negative", &out->negative));
  json size = json::object();
  for (const char* key : {"of", "dim", "dim_arg"}) {
    if (const json* v = f.Find(key)) size[key] = *v;
  }
  COV_RETURN_IF_ERROR(ReadSize(size, what, &out->size));
  if (!out->list.empty() && (out->size.dim || !out->size.dim_arg.empty() || out->size.class_dim)) {
    return Status::Corruption(what + ": a 'list' indexes dimension i with its i-th tensor; give no dim");
  }
  return Status::Ok();
}

Status ReadValuesRule(const json& j, const std::string& what, ValuesRule* out) {
  const JsonFields f(j, what);
  COV_RETURN_IF_ERROR(f.OnlyMembers({"arg", "kind", "total", "first_zero", "last_total", "last_total_if", "plane"}));
  COV_RETURN_IF_ERROR(f.RequiredString("arg", &out->arg));
  std::string kind;
  COV_RETURN_IF_ERROR(f.RequiredString("kind", &kind));
  using Kind = StructuredValues::Kind;
  if (kind == "offsets") {
    out->kind = Kind::kOffsets;
  } else if (kind == "lengths") {
    out->kind = Kind::kLengths;
  } else if (kind == "distinct_indices") {
    out->kind = Kind::kDistinctIndices;
  } else if (kind == "positive_definite") {
    out->kind = Kind::kPositiveDefinite;
  } else {
    return f.Error("kind", "unknown kind '" + kind + "' (expected offsets, lengths, distinct_indices, "
                           "positive_definite)");
  }
  if (out->kind == Kind::kOffsets || out->kind == Kind::kLengths) {
    const json* total = f.Find("total");
    if (!total) return f.Error("total", "missing (offsets and lengths need the total they reach)");
    COV_RETURN_IF_ERROR(ReadSizes(*total, what + ".total", &out->total));
  }
  COV_RETURN_IF_ERROR(f.Bool("first_zero", &out->first_zero));
  COV_RETURN_IF_ERROR(f.Bool("last_total", &out->last_total));
  COV_RETURN_IF_ERROR(f.String("last_total_if", &out->last_total_if));
  COV_RETURN_IF_ERROR(f.String("plane", &out->plane));
  if (out->kind == Kind::kDistinctIndices && out->plane.empty()) {
    return f.Error("plane", "missing (the int-list argument whose sizes make one plane)");
  }
  return Status::Ok();
}

Result<RuleTable> ParseRules(std::string_view text, std::string_view source) {
  const std::string src(source);
  const json j = json::parse(text, nullptr, false);
  if (!j.is_object()) return Status::Corruption(src + ": not a JSON object");
  RuleTable table;
  auto ops = j.find("ops");
  if (ops == j.end() || !ops->is_object()) return table;
  for (const auto& [op, entry] : ops->items()) {
    if (!entry.is_object() || !entry.contains("inputs")) continue;
    const std::string what = src + ": ops." + op + ".inputs";
    if (op.find('.') != std::string::npos) {
      return Status::Corruption(what + ": input rules apply to an op by its name, without an overload");
    }
    const json& inputs = entry["inputs"];
    const JsonFields f(inputs, what);
    COV_RETURN_IF_ERROR(f.OnlyMembers({"index", "values", "comment"}));
    OpRules rules;
    if (const json* index = f.Find("index")) {
      IndexRule r;
      COV_RETURN_IF_ERROR(ReadIndexRule(*index, what + ".index", &r));
      rules.index = std::move(r);
    }
    if (const json* values = f.Find("values")) {
      if (!values->is_array()) return f.Error("values", "expected an array of rules (the first that applies is used)");
      for (size_t i = 0; i < values->size(); ++i) {
        ValuesRule r;
        COV_RETURN_IF_ERROR(ReadValuesRule((*values)[i], what + ".values[" + std::to_string(i) + "]", &r));
        rules.values.push_back(std::move(r));
      }
    }
    table.ops.emplace(op, std::move(rules));
    table.raw.emplace(op, inputs);
  }
  return table;
}

// The built-in rules. Broken built-in rules are a bug in the build, not bad
// input: they abort with the reason (a test parses them, so a broken edit
// fails there first).
const RuleTable& Rules() {
  static const RuleTable table = [] {
    auto parsed = ParseRules(kShippedRulesJson, "configs/tolerances.json (built in)");
    if (!parsed) {
      std::fprintf(stderr, "coverage: %s\n", parsed.error().message().c_str());
      std::abort();
    }
    return std::move(*parsed);
  }();
  return table;
}

const OpRules* RulesOf(std::string_view op) {
  const auto& ops = Rules().ops;
  auto it = ops.find(op);
  return it == ops.end() ? nullptr : &it->second;
}

const Argument* FindArg(const OpCase& c, std::string_view name) {
  for (const auto& a : c.args) {
    if (a.name == name) return &a;
  }
  return nullptr;
}

const TensorSpec* TensorArg(const OpCase& c, std::string_view name) {
  const Argument* a = FindArg(c, name);
  return a && a->kind == Argument::Kind::kTensor ? &a->tensor : nullptr;
}

std::optional<int64_t> IntArg(const OpCase& c, std::string_view name) {
  const Argument* a = FindArg(c, name);
  if (a && a->kind == Argument::Kind::kInt) return a->i;
  return std::nullopt;
}

// The size `s` reads off `c`, or none where it does not apply.
std::optional<int64_t> SizeIn(const OpCase& c, const SizeOf& s, std::optional<int64_t> list_dim = std::nullopt) {
  if (!s.int_arg.empty()) {
    auto v = IntArg(c, s.int_arg);
    if (!v || *v < 0) return std::nullopt;
    return v;
  }
  for (const auto& [name, rank] : s.ranks) {
    const TensorSpec* t = TensorArg(c, name);
    if (!t || static_cast<int64_t>(t->shape.size()) != rank) return std::nullopt;
  }
  const TensorSpec* t = TensorArg(c, s.of);
  if (!t || t->shape.empty()) return std::nullopt;
  const int64_t rank = static_cast<int64_t>(t->shape.size());
  if (s.rank && *s.rank != rank) return std::nullopt;
  int64_t dim = list_dim ? *list_dim
                : s.class_dim ? (rank >= 2 ? 1 : 0)
                : s.dim ? *s.dim
                : !s.dim_arg.empty() ? IntArg(c, s.dim_arg).value_or(0)
                : 0;
  if (dim < 0) dim += rank;
  if (dim < 0 || dim >= rank) return std::nullopt;
  return t->shape[dim];
}

// Gives `index` the whole indexed dimension as its range: [0, size), or
// [-size, size) where negative indices are allowed and were seen.
void IndexWholeDimension(TensorSpec& index, int64_t size, bool allow_negative) {
  if (index.domain.kind != ValueDomain::Kind::kInteger || size <= 0) return;
  index.domain.lo = allow_negative && index.domain.lo < 0 ? -size : 0;
  index.domain.hi = size;
}

}  // namespace

void IndexRules(OpCase& c) {
  const OpRules* rules = RulesOf(c.op);
  if (!rules || !rules->index) return;
  const IndexRule& r = *rules->index;
  if (!r.list.empty()) {
    Argument* list = nullptr;
    for (auto& a : c.args) {
      if (a.name == r.list && a.kind == Argument::Kind::kTensorList) list = &a;
    }
    if (!list || !TensorArg(c, r.size.of)) return;
    for (size_t i = 0; i < list->tensors.size(); ++i) {
      auto& t = list->tensors[i];
      if (!t || t->dtype == DType::kBool) continue;  // a mask selects; it does not index
      IndexWholeDimension(*t, SizeIn(c, r.size, static_cast<int64_t>(i)).value_or(0), r.negative);
    }
    return;
  }
  const int64_t size = SizeIn(c, r.size).value_or(0);
  for (const std::string& name : r.args) {
    for (auto& a : c.args) {
      if (a.name == name && a.kind == Argument::Kind::kTensor) {
        IndexWholeDimension(a.tensor, size, r.negative);
        return;
      }
    }
  }
}

std::vector<int64_t> IndexedSizes(const OpCase& op_case) {
  // Every tensor gets the marker range [0, -1); the rules replace the
  // range of those that index a dimension with [0, size).
  OpCase c = op_case;
  auto mark = [](TensorSpec& t) { t.domain = ValueDomain{ValueDomain::Kind::kInteger, 0, -1}; };
  for (auto& a : c.args) {
    if (a.kind == Argument::Kind::kTensor) mark(a.tensor);
    if (a.kind == Argument::Kind::kTensorList) {
      for (auto& t : a.tensors) {
        if (t) mark(*t);
      }
    }
  }
  IndexRules(c);
  std::vector<int64_t> sizes;
  for (const auto& a : c.args) {
    if (a.kind == Argument::Kind::kTensor) sizes.push_back(std::max<int64_t>(a.tensor.domain.hi, 0));
    if (a.kind == Argument::Kind::kTensorList) {
      for (const auto& t : a.tensors) sizes.push_back(t ? std::max<int64_t>(t->domain.hi, 0) : 0);
    }
  }
  return sizes;
}

std::string StructuredValues::KeySuffix() const {
  switch (kind) {
    case Kind::kNone: return "";
    case Kind::kOffsets: return "|offsets" + std::to_string(total) + (first_zero ? "f" : "") + (last_total ? "l" : "");
    case Kind::kLengths: return "|lengths" + std::to_string(total);
    case Kind::kDistinctIndices: return "|distinct" + std::to_string(total) + "/" + std::to_string(plane_dims);
    case Kind::kPositiveDefinite: return "|spd";
  }
  return "";
}

StructuredValues StructuredValuesOf(const OpCase& c) {
  const OpRules* rules = RulesOf(c.op);
  if (!rules) return {};
  using Kind = StructuredValues::Kind;
  for (const ValuesRule& r : rules->values) {
    const TensorSpec* arg = TensorArg(c, r.arg);
    if (!arg) continue;
    StructuredValues out;
    out.kind = r.kind;
    out.arg = r.arg;
    out.first_zero = r.first_zero;
    out.last_total = r.last_total;
    if (!r.last_total_if.empty()) {
      const Argument* flag = FindArg(c, r.last_total_if);
      out.last_total = flag && flag->kind == Argument::Kind::kBool && flag->b;
    }
    switch (r.kind) {
      case Kind::kOffsets:
      case Kind::kLengths: {
        std::optional<int64_t> total;
        for (const SizeOf& s : r.total) {
          if ((total = SizeIn(c, s))) break;
        }
        if (!total) continue;
        out.total = *total;
        return out;
      }
      case Kind::kDistinctIndices: {
        const Argument* plane = FindArg(c, r.plane);
        if (!plane || plane->kind != Argument::Kind::kIntList || plane->ints.empty()) continue;
        out.plane_dims = static_cast<int64_t>(plane->ints.size());
        out.total = 1;
        for (int64_t d : plane->ints) out.total *= std::max<int64_t>(d, 0);
        return out;
      }
      case Kind::kPositiveDefinite:
        if (arg->shape.size() < 2 || arg->shape.end()[-1] != arg->shape.end()[-2]) continue;
        return out;
      case Kind::kNone:
        break;
    }
  }
  return {};
}

const nlohmann::json& BuiltInInputRules(std::string_view op) {
  static const json kNull;
  const auto& raw = Rules().raw;
  auto it = raw.find(op);
  return it == raw.end() ? kNull : it->second;
}

Status CheckInputRules(std::string_view text, std::string_view source) {
  auto parsed = ParseRules(text, source);
  return parsed ? Status::Ok() : parsed.error();
}

}  // namespace coverage
