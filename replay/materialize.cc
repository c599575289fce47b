#include "replay/materialize.h"

#include <algorithm>
#include <cstring>
#include <cmath>
#include <limits>
#include <optional>

#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/Parallel.h>

#include "backends/dtype_map.h"
#include "core/input_rules.h"
#include "core/json_double.h"

namespace coverage::replay {
using backends::ToDType;
using backends::ToScalarType;
namespace {

// Note [Value domains]
// ~~~~~~~~~~~~~~~~~~~~
// A replayed input must keep the op valid and meaningful:
//  * Float tensors are drawn uniformly from a range picked by the domain
//    recorded at capture (the tracer looks at the real values, domain_of
//    in capture/tracer/coverage_tracer/encode.py):
//    real -> [-1, 1), nonneg -> [0, 2), positive -> [0.5, 2), unit -> [0.002, 0.998)
//    (a probability, and positive).
//    So the variance fed to rsqrt stays >= 0 and a divisor stays away from 0.
//  * Additive attention masks (domain "mask": zeros and -inf) are replayed as
//    a causal mask over the last two dimensions (row i sees columns
//    <= i + cols - rows), so softmax rows never become all -inf. A mask
//    recorded with non-contiguous strides is replayed as zeros (no masking).
//  * Integer tensors are drawn uniformly from [lo, hi), the coarsened range
//    recorded at capture (zero only where zero was seen,
//    never above the largest value seen), and reach both ends of it: the
//    storage's first element is lo and its last hi - 1, so a kernel that
//    breaks only at the top of its range (an embedding past row 32767) is
//    found. Ops whose integer argument indexes a dimension take the whole
//    dimension as the range (IndexRules, core/input_rules.h): an index recorded in
//    [1, 32768) of a 50,257-row table replays in [0, 50257) and reads row
//    50256; index tensors always lie inside the indexed dimension, even for
//    hand-written cases.
//  * Bool tensors get a fixed pseudo-random pattern (about half true).
//  * A constant (a Python number the model passed for a Tensor argument,
//    which libtorch sees as a 0-dim tensor) is replayed as the recorded
//    value: AdamW's param.mul_(1 - lr * wd) multiplies by 0.99999, not by a
//    random number.
// All values come from one pool of 4M uniform floats generated once with a
// fixed SplitMix64 stream; a tensor starts at a pool offset derived from its
// spec, its rank among the case's arguments with the same spec, and the seed.
// So inputs are deterministic, differ between arguments, cost one pass to
// make, and are identical (and cached) wherever the same spec recurs.

constexpr size_t kPoolBits = 22;
constexpr size_t kPoolSize = size_t{1} << kPoolBits;
constexpr size_t kPoolMask = kPoolSize - 1;

uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

const std::vector<float>& Pool() {
  static const std::vector<float> pool = [] {
    std::vector<float> p(kPoolSize);
    uint64_t state = 0x5eed5eed5eedULL;
    for (auto& v : p) v = static_cast<float>(SplitMix64(state) >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    return p;
  }();
  return pool;
}

// The same for standard normal values (Box-Muller over a second SplitMix64
// stream): program replay's parameters initialised with a normal rule.
const std::vector<float>& NormalPool() {
  static const std::vector<float> pool = [] {
    std::vector<float> p(kPoolSize);
    uint64_t state = 0x6a09e667f3bcc909ULL;
    constexpr double kTwoPi = 6.283185307179586;
    for (size_t i = 0; i < kPoolSize; i += 2) {
      const double u1 = (static_cast<double>(SplitMix64(state) >> 11) + 1.0) * (1.0 / 9007199254740992.0);  // (0, 1]
      const double u2 = static_cast<double>(SplitMix64(state) >> 11) * (1.0 / 9007199254740992.0);
      const double r = std::sqrt(-2.0 * std::log(u1));
      p[i] = static_cast<float>(r * std::cos(kTwoPi * u2));
      p[i + 1] = static_cast<float>(r * std::sin(kTwoPi * u2));
    }
    return p;
  }();
  return pool;
}

// Fills `n` elements at `out` with pool[offset + i] * scale + shift,
// computed in C (float or double) and stored as T. Split into fixed chunks
// across ATen's intra-op threads: making inputs is a memory-bound pass, and
// on big weights it was most of the harness overhead (bench/README.md).
template <typename T, typename C = float>
void FillAffine(T* out, int64_t n, uint64_t offset, double scale, double shift, const float* pool = Pool().data()) {
  const C s = static_cast<C>(scale), b = static_cast<C>(shift);
  constexpr int64_t kChunk = 1 << 16;
  at::parallel_for(0, n, kChunk, [&](int64_t begin, int64_t end) {
    int64_t i = begin;
    size_t pos = (offset + static_cast<uint64_t>(begin)) & kPoolMask;
    while (i < end) {
      const int64_t len = std::min<int64_t>(end - i, static_cast<int64_t>(kPoolSize - pos));
      T* dst = out + i;
      const float* src = pool + pos;
      for (int64_t k = 0; k < len; ++k) dst[k] = static_cast<T>(static_cast<C>(src[k]) * s + b);
      i += len;
      pos = 0;
    }
  });
}

std::pair<double, double> AffineFor(ValueDomain::Kind kind) {
  switch (kind) {
    case ValueDomain::Kind::kNonNegative: return {2.0, 0.0};
    case ValueDomain::Kind::kPositive: return {1.5, 0.5};
    case ValueDomain::Kind::kUnit: return {0.996, 0.002};  // inside (0, 1): a probability, and a positive one
    default: return {2.0, -1.0};
  }
}

at::Tensor CausalMask(const TensorSpec& spec) {
  auto opts = at::TensorOptions().dtype(at::kFloat);
  const auto& shape = spec.shape;
  if (shape.size() < 2) return at::zeros(shape, opts);
  int64_t rows = shape[shape.size() - 2], cols = shape.back();
  at::Tensor keep = at::ones({rows, cols}, opts.dtype(at::kBool)).tril(cols - rows);
  at::Tensor mask = at::zeros({rows, cols}, opts).masked_fill(keep.logical_not(), -std::numeric_limits<float>::infinity());
  return mask.expand(shape).contiguous();
}

// `n` elements pool[offset + i] * scale + shift in a flat tensor of `st`
// when it is double, bfloat16 or half, else float (the caller converts).
// A double tensor is computed in double, or in float where it stands for a
// float tensor (`double_from_float`: the golden's leaves).
at::Tensor FillFlat(c10::ScalarType st, int64_t n, uint64_t offset, double scale, double shift, const float* pool,
                    bool double_from_float) {
  switch (st) {
    case at::kDouble: {
      at::Tensor t = at::empty({n}, at::kDouble);
      if (double_from_float) {
        FillAffine<double, float>(t.data_ptr<double>(), n, offset, scale, shift, pool);
      } else {
        FillAffine<double, double>(t.data_ptr<double>(), n, offset, scale, shift, pool);
      }
      return t;
    }
    case at::kBFloat16: {
      at::Tensor t = at::empty({n}, at::kBFloat16);
      FillAffine(t.data_ptr<c10::BFloat16>(), n, offset, scale, shift, pool);
      return t;
    }
    case at::kHalf: {
      at::Tensor t = at::empty({n}, at::kHalf);
      FillAffine(t.data_ptr<c10::Half>(), n, offset, scale, shift, pool);
      return t;
    }
    default: {
      at::Tensor t = at::empty({n}, at::kFloat);
      FillAffine(t.data_ptr<float>(), n, offset, scale, shift, pool);
      return t;
    }
  }
}

// Makes the storage base (contiguous, StorageNumel elements) for one tensor.
at::Tensor MakeBase(const TensorSpec& spec, uint64_t offset) {
  const int64_t n = spec.StorageNumel();
  const c10::ScalarType st = ToScalarType(spec.dtype);
  const ValueDomain& d = spec.domain;
  if (d.kind == ValueDomain::Kind::kConstant) {
    if (spec.dtype == DType::kComplex64 || spec.dtype == DType::kComplex128) {
      return at::full({n}, c10::complex<double>(d.value, 0.0), at::TensorOptions().dtype(st));
    }
    return at::full({n}, d.value, at::TensorOptions().dtype(at::kDouble)).to(st);
  }
  if (d.kind == ValueDomain::Kind::kMask && IsFloatingDType(spec.dtype)) {
    if (spec.IsContiguous()) return CausalMask(spec).reshape({-1}).to(st);
    return at::zeros({n}, at::TensorOptions().dtype(st));
  }
  if (spec.dtype == DType::kBool) {
    at::Tensor u = at::empty({n}, at::kFloat);
    FillAffine(u.data_ptr<float>(), n, offset, 1.0, 0.0);
    return u.lt(0.5);
  }
  if (IsIntegralDType(spec.dtype) || d.kind == ValueDomain::Kind::kInteger) {
    // In double: a domain as wide as int64 (a recorded one starting at its minimum)
    // overflows hi - lo in int64 (found by UBSan). An integer dtype keeps the
    // values inside its range, so that the conversion below is defined.
    double lo = d.kind == ValueDomain::Kind::kInteger ? static_cast<double>(d.lo) : 0.0;
    double hi = d.kind == ValueDomain::Kind::kInteger ? static_cast<double>(d.hi) : 16.0;
    double top = std::numeric_limits<double>::infinity();  // values stay below it
    if (IsIntegralDType(spec.dtype)) {
      const int bits = static_cast<int>(8 * DTypeSize(spec.dtype));
      const bool is_unsigned = spec.dtype == DType::kUInt8;
      const double bottom = is_unsigned ? 0.0 : -std::ldexp(1.0, bits - 1);
      top = is_unsigned ? std::ldexp(1.0, bits) : std::ldexp(1.0, bits - 1);  // exact powers of two
      lo = std::clamp(lo, bottom, top - 1);
      hi = std::clamp(hi, lo + 1, top);
    }
    if (!(hi > lo)) hi = lo + 1;
    at::Tensor u = at::empty({n}, at::kDouble);
    FillAffine<double, double>(u.data_ptr<double>(), n, offset, hi - lo, lo);
    // hi - 1 rounds up to 2^63 for int64; the largest double below the top stays in range.
    const double upper = std::min(hi - 1, std::nextafter(top, 0.0));
    u.floor_().clamp_(lo, upper);
    if (n > 0) {  // both ends of the range (Note [Value domains])
      double* p = u.data_ptr<double>();
      p[0] = lo;
      p[n - 1] = n > 1 ? std::floor(upper) : lo;
    }
    return u.to(st);
  }
  auto [scale, shift] = AffineFor(d.kind);
  at::Tensor t = FillFlat(st, n, offset, scale, shift, Pool().data(), /*double_from_float=*/false);
  if (spec.dtype == DType::kComplex64 || spec.dtype == DType::kComplex128) {
    return at::complex(t, t.flip({0})).to(st);
  }
  return t.scalar_type() == st ? t : t.to(st);
}

// Note [Structured arguments]
// Some arguments are not free values but carry a structure the op relies on;
// drawn uniformly they send the kernel out of bounds (garbage that changes
// from run to run, on the reference too), race on duplicate writes, or are
// refused by the reference. A rule (StructuredValues, core/input_rules.h;
// which op's argument needs which is data: the "values" input rules of
// configs/tolerances.json) replaces the drawn values of one argument with
// values of that structure, still drawn from the case's seed: offsets
// (aten::_grouped_mm's offs, the embedding_bag ops' offsets, segment_reduce's
// offsets), lengths (segment_reduce's lengths, repeat_interleave's repeats
// with an output_size), distinct indices (max_unpool's indices) and a
// positive definite matrix (the cholesky ops' input). The rule's name joins
// the input cache key: the same spec under another rule is another tensor.
// The values `rule` asks for, from the drawn values `v` (the argument's view).
at::Tensor Structured(const at::Tensor& v, const StructuredValues& rule) {
  using Kind = StructuredValues::Kind;
  switch (rule.kind) {
    case Kind::kNone: return v;
    case Kind::kOffsets: {
      at::Tensor sorted = std::get<0>(v.clamp(0, rule.total).sort(-1));
      if (sorted.numel() > 0 && rule.first_zero) sorted.select(-1, 0).fill_(0);
      if (sorted.numel() > 0 && rule.last_total) sorted.select(-1, -1).fill_(rule.total);
      return sorted;
    }
    case Kind::kLengths: {
      if (v.dim() == 0 || v.numel() == 0) return v.clone().fill_(rule.total);
      at::Tensor cuts = std::get<0>(v.to(at::kLong).clamp(0, rule.total).sort(-1));
      cuts.select(-1, -1).fill_(rule.total);
      return at::diff(cuts, 1, -1, at::zeros_like(cuts.narrow(-1, 0, 1))).to(v.scalar_type());
    }
    case Kind::kDistinctIndices: {
      // Plane k's element j gets j * step + (its drawn value mod step): distinct
      // and inside [0, total) while the plane has at most `total` elements.
      if (v.dim() < rule.plane_dims || v.numel() == 0 || rule.total <= 0) return v;
      int64_t count = 1;
      for (int64_t d = v.dim() - rule.plane_dims; d < v.dim(); ++d) count *= v.size(d);
      const int64_t step = std::max<int64_t>(1, rule.total / std::max<int64_t>(count, 1));
      at::Tensor j = at::arange(count, at::kLong).view(v.sizes().slice(v.dim() - rule.plane_dims));
      at::Tensor idx = (j * step + v.to(at::kLong).remainder(step)).remainder(rule.total);
      return idx.expand(v.sizes()).to(v.scalar_type());
    }
    case Kind::kPositiveDefinite: {
      if (!(v.is_floating_point() || v.is_complex())) return v;
      const at::ScalarType wide = v.is_complex() ? at::kComplexDouble : at::kDouble;
      at::Tensor a = v.to(wide);
      const int64_t n = a.size(-1);
      at::Tensor spd = at::matmul(a, a.transpose(-2, -1).conj()) + at::eye(n, a.options()) * static_cast<double>(n);
      return spd.to(v.scalar_type());
    }
  }
  return v;
}

// The storage base with the argument's view holding the values of `rule`.
// Views that overlap themselves (expanded arguments) keep the drawn values.
at::Tensor ApplyRule(const at::Tensor& base, const TensorSpec& spec, const StructuredValues& rule) {
  at::Tensor out = base.clone();
  at::Tensor view = out.as_strided(spec.shape, spec.strides, spec.storage_offset);
  if (at::has_internal_overlap(view) != at::MemOverlap::No) return base;
  view.copy_(Structured(view.clone(), rule));
  return out;
}

bool IsOptionalTensorList(const c10::Argument& arg) {
  auto list = arg.type()->cast<c10::ListType>();
  return list && list->getElementType()->kind() == c10::TypeKind::OptionalType;
}

}  // namespace


uint64_t Fingerprint(const at::Tensor& t) {
  const auto* bytes = static_cast<const unsigned char*>(t.data_ptr());
  const int64_t nbytes = static_cast<int64_t>(t.nbytes());
  const int64_t words = nbytes / 8;
  constexpr int64_t kChunk = 1 << 16;
  const int64_t chunks = (words + kChunk - 1) / kChunk;
  std::vector<uint64_t> parts(static_cast<size_t>(std::max<int64_t>(chunks, 1)), 0);
  at::parallel_for(0, chunks, 1, [&](int64_t first, int64_t last) {
    for (int64_t c = first; c < last; ++c) {
      uint64_t h = 0;
      for (int64_t i = c * kChunk; i < std::min(words, (c + 1) * kChunk); ++i) {
        uint64_t w;
        std::memcpy(&w, bytes + 8 * i, 8);
        h += (w ^ static_cast<uint64_t>(i)) * 0x9e3779b97f4a7c15ULL;
        h = (h << 7) | (h >> 57);
      }
      parts[c] = h;
    }
  });
  uint64_t h = static_cast<uint64_t>(nbytes);
  for (uint64_t p : parts) h = (h ^ p) * 0x100000001b3ULL;
  for (int64_t i = words * 8; i < nbytes; ++i) h = (h ^ bytes[i]) * 0x100000001b3ULL;
  return h;
}

InputCache::Entry InputCache::GetOrMake(const std::string& key, const std::function<at::Tensor()>& make) {
  auto it = index_.find(key);
  if (it != index_.end()) {
    ++hits_;
    if (large_.empty() || it->second != large_.begin()) lru_.splice(lru_.begin(), lru_, it->second);
    return *it->second;
  }
  ++misses_;
  Entry entry{key, make(), 0};
  const int64_t size = static_cast<int64_t>(entry.base.nbytes());
  if (size > budget_) {
    // Kept alone, outside the budget, for the cases after this one that
    // share it (Note [Case order]); KeepLargeOnlyFor lets it go.
    if (!large_.empty()) index_.erase(large_.front().key);
    large_.assign(1, entry);
    index_[key] = large_.begin();
    return entry;
  }
  lru_.push_front(entry);
  index_[key] = lru_.begin();
  bytes_ += size;
  while (bytes_ > budget_ && !lru_.empty()) {
    bytes_ -= static_cast<int64_t>(lru_.back().base.nbytes());
    index_.erase(lru_.back().key);
    lru_.pop_back();
  }
  return entry;
}

void InputCache::KeepLargeOnlyFor(const std::vector<std::string>& keys) {
  if (large_.empty() || std::find(keys.begin(), keys.end(), large_.front().key) != keys.end()) return;
  index_.erase(large_.front().key);
  large_.clear();
}

void InputCache::SetFingerprint(const std::string& key, uint64_t fingerprint) {
  auto it = index_.find(key);
  if (it != index_.end()) it->second->fingerprint = fingerprint;
}

void InputCache::Evict(const std::string& key) {
  auto it = index_.find(key);
  if (it == index_.end()) return;
  if (!large_.empty() && it->second == large_.begin()) {
    large_.clear();
  } else {
    bytes_ -= static_cast<int64_t>(it->second->base.nbytes());
    lru_.erase(it->second);
  }
  index_.erase(it);
}

at::Tensor MaterializedCase::MakeView(int id, c10::Device device, bool fresh, bool to_double, bool verify) {
  TensorInput& in = tensors_[id];
  const TensorSpec& spec = in.spec;
  at::ScalarType target = ToScalarType(spec.dtype);
  if (to_double) {
    if (IsFloatingDType(spec.dtype)) target = at::kDouble;
    if (spec.dtype == DType::kComplex64) target = at::kComplexDouble;
  }
  if (fresh) {
    // Written by the op: a copy of its own for every call, made from the CPU
    // base directly (a device copy kept only to clone it from would be one
    // more copy of it per case).
    return in.base.to(device, target, /*non_blocking=*/false, /*copy=*/true)
        .as_strided(spec.shape, spec.strides, spec.storage_offset);
  }
  const std::string cache_key = std::to_string(id) + "/" + device.str() + "/" + c10::toString(target);
  at::Tensor base;
  for (const auto& [k, t] : cache_) {
    if (k == cache_key) base = t;
  }
  if (!base.defined()) {
    base = in.base.to(device, target);  // the base itself when nothing changes
    cache_.emplace_back(cache_key, base);
  }
  if (verify && base.is_same(in.base) && !in.shared_with_backend) {
    // The backend reads the shared storage in place (copying it could cost
    // more than the op); VerifyReadOnlyInputs checks it afterwards.
    in.shared_with_backend = true;
    if (in.fingerprint == 0) {
      in.fingerprint = Fingerprint(in.base);
      if (cache_ptr_) cache_ptr_->SetFingerprint(in.cache_key, in.fingerprint);
    }
  }
  return base.as_strided(spec.shape, spec.strides, spec.storage_offset);
}

Status MaterializedCase::VerifyReadOnlyInputs() {
  std::string changed;
  for (auto& in : tensors_) {
    if (!in.shared_with_backend) continue;
    if (Fingerprint(in.base) == in.fingerprint) continue;
    // Every changed storage leaves the cache, so no later case reads it.
    if (cache_ptr_) cache_ptr_->Evict(in.cache_key);
    changed += (changed.empty() ? "'" : ", '") + in.arg_name + "'";
  }
  if (changed.empty()) return Status::Ok();
  return Status::InvalidArgument("the backend wrote into argument " + changed + ", which the schema of " +
                                 op_case_.QualifiedName() + " marks read-only");
}

Result<std::vector<c10::IValue>> MaterializedCase::Build(c10::Device device, bool to_double, bool verify) {
  std::vector<c10::IValue> out;
  out.reserve(slots_.size());
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& slot = slots_[i];
    const Argument& a = op_case_.args[slot.arg_index];
    const bool fresh_here = mutated_[i];
    switch (a.kind) {
      case Argument::Kind::kNone: out.emplace_back(); break;
      case Argument::Kind::kTensor: out.emplace_back(MakeView(slot.tensor_ids[0], device, fresh_here, to_double, verify)); break;
      case Argument::Kind::kTensorList: {
        if (slot.optional_list) {
          c10::List<std::optional<at::Tensor>> list;
          for (int id : slot.tensor_ids) {
            list.push_back(id < 0 ? std::optional<at::Tensor>() : std::optional<at::Tensor>(MakeView(id, device, fresh_here, to_double, verify)));
          }
          out.emplace_back(std::move(list));
        } else {
          std::vector<at::Tensor> list;
          for (int id : slot.tensor_ids) {
            if (id < 0) return Status::InvalidArgument(op_case_.QualifiedName() + ": argument '" + a.name + "' is a Tensor[] with a None item");
            list.push_back(MakeView(id, device, fresh_here, to_double, verify));
          }
          out.emplace_back(std::move(list));
        }
        break;
      }
      default: {
        c10::IValue v = NonTensorIValue(a, device);
        out.push_back(slot.scalar_list ? NumberListFor(v) : v);
        break;
      }
    }
  }
  return out;
}

bool IsScalarList(const c10::Argument& schema_arg) {
  const c10::TypePtr& t = schema_arg.type();
  return t->kind() == c10::TypeKind::ListType &&
         t->expectRef<c10::ListType>().getElementType()->kind() == c10::TypeKind::NumberType;
}

c10::IValue NumberListFor(const c10::IValue& list) {
  c10::impl::GenericList numbers(c10::NumberType::get());
  if (list.isDoubleList()) {
    for (double d : list.toDoubleVector()) numbers.push_back(d);
  } else if (list.isIntList()) {
    for (int64_t i : list.toIntVector()) numbers.push_back(i);
  } else {
    return list;
  }
  return numbers;
}

c10::IValue NonTensorIValue(const Argument& a, c10::Device device) {
  switch (a.kind) {
    case Argument::Kind::kInt: return a.i;
    case Argument::Kind::kDouble: return a.d;
    case Argument::Kind::kBool: return a.b;
    case Argument::Kind::kString: return a.s;
    case Argument::Kind::kIntList: return a.ints;
    case Argument::Kind::kDoubleList: return a.doubles;
    case Argument::Kind::kBoolList: {
      c10::List<bool> list;
      for (bool b : a.bools) list.push_back(b);
      return list;
    }
    case Argument::Kind::kDevice: return device;
    default: return c10::IValue();  // None; tensors are the caller's
  }
}

// A stable text form of the spec (shape, strides, offset, dtype, domain).
static std::string SpecKey(const TensorSpec& t) {
  std::string k(DTypeName(t.dtype));
  for (int64_t s : t.shape) k += "," + std::to_string(s);
  k += "|";
  for (int64_t s : t.strides) k += "," + std::to_string(s);
  k += "|" + std::to_string(t.storage_offset) + "|" + std::string(ValueDomainKindName(t.domain.kind));
  if (t.domain.kind == ValueDomain::Kind::kInteger) k += std::to_string(t.domain.lo) + ":" + std::to_string(t.domain.hi);
  if (t.domain.kind == ValueDomain::Kind::kConstant) k += "=" + DoubleToJson(t.domain.value).dump();
  return k;
}

at::Tensor MakeInitialised(const TensorSpec& spec, InitRule rule, double a, double b, uint64_t stream) {
  const int64_t n = spec.StorageNumel();
  const c10::ScalarType st = ToScalarType(spec.dtype);
  const float* pool = rule == InitRule::kNormal ? NormalPool().data() : Pool().data();
  // normal: mean a, std b; uniform: [a, b).
  const double scale = rule == InitRule::kNormal ? b : b - a;
  const double shift = a;
  at::Tensor t = FillFlat(st, n, SplitMix64(stream), scale, shift, pool, /*double_from_float=*/true);
  if (t.scalar_type() != st) t = t.to(st);
  return t.as_strided(spec.shape, spec.strides, spec.storage_offset);
}

at::Tensor MakeTensor(const TensorSpec& spec, std::string_view name, uint64_t seed) {
  const std::string key = std::string(name) + "|" + SpecKey(spec) + "@" + std::to_string(seed);
  uint64_t state = 0xcbf29ce484222325ULL;
  for (unsigned char ch : key) state = (state ^ ch) * 0x100000001b3ULL;
  const uint64_t offset = SplitMix64(state);
  return MakeBase(spec, offset).as_strided(spec.shape, spec.strides, spec.storage_offset);
}

Result<MaterializedCase> Materialize(const OpCase& input_case, const c10::FunctionSchema& schema, uint64_t seed,
                                     InputCache* cache) {
  MaterializedCase m;
  m.op_case_ = input_case;
  m.cache_ptr_ = cache;
  IndexRules(m.op_case_);
  const StructuredValues rule = StructuredValuesOf(m.op_case_);
  const auto& schema_args = schema.arguments();
  if (schema_args.size() != m.op_case_.args.size()) {
    return Status::InvalidArgument(input_case.QualifiedName() + ": case has " + std::to_string(input_case.args.size()) +
                                   " arguments but the schema '" + c10::toString(schema) + "' has " +
                                   std::to_string(schema_args.size()));
  }
  // Each tensor argument is checked and keyed first (Note [Storage keys] in
  // core/op_case.cc; a structured argument's values follow its view, so its
  // whole spec keys it), and made or taken from the cache after.
  std::unordered_map<std::string, int> rank;  // how often a storage key occurred so far in this case
  std::vector<bool> structured;               // per tensor input: its values follow the op's rule
  for (size_t i = 0; i < schema_args.size(); ++i) {
    const Argument& a = m.op_case_.args[i];
    MaterializedCase::Slot slot;
    slot.arg_index = i;
    slot.optional_list = IsOptionalTensorList(schema_args[i]);
    slot.scalar_list = IsScalarList(schema_args[i]);
    const auto* alias = schema_args[i].alias_info();
    m.mutated_.push_back(alias != nullptr && alias->isWrite());
    auto add_tensor = [&](const TensorSpec& spec) -> Status {
      if (spec.strides.size() != spec.shape.size()) {
        return Status::InvalidArgument(input_case.QualifiedName() + ": argument '" + a.name + "' has mismatched shape and strides");
      }
      for (int64_t s : spec.strides) {
        if (s < 0) return Status::InvalidArgument(input_case.QualifiedName() + ": argument '" + a.name + "' has a negative stride");
      }
      const bool by_rule = rule.kind != StructuredValues::Kind::kNone && a.name == rule.arg;
      const std::string storage = by_rule ? SpecKey(spec) : spec.StorageKey();
      MaterializedCase::TensorInput in;
      in.cache_key = storage + "#" + std::to_string(rank[storage]++) + "@" + std::to_string(seed) +
                     (by_rule ? rule.KeySuffix() : "");
      in.spec = spec;
      in.arg_name = a.name;
      m.tensors_.push_back(std::move(in));
      structured.push_back(by_rule);
      slot.tensor_ids.push_back(static_cast<int>(m.tensors_.size() - 1));
      return Status::Ok();
    };
    if (a.kind == Argument::Kind::kTensor) {
      COV_RETURN_IF_ERROR(add_tensor(a.tensor));
    } else if (a.kind == Argument::Kind::kTensorList) {
      for (const auto& t : a.tensors) {
        if (t) {
          COV_RETURN_IF_ERROR(add_tensor(*t));
        } else {
          slot.tensor_ids.push_back(-1);
        }
      }
    }
    m.slots_.push_back(std::move(slot));
  }
  if (cache) {
    // A large input the cache kept for the cases before stays only if this
    // case reads it too.
    std::vector<std::string> keys;
    for (const auto& in : m.tensors_) keys.push_back(in.cache_key);
    cache->KeepLargeOnlyFor(keys);
  }
  for (size_t k = 0; k < m.tensors_.size(); ++k) {
    MaterializedCase::TensorInput& in = m.tensors_[k];
    uint64_t state = 0xcbf29ce484222325ULL;  // FNV-1a: portable, unlike std::hash
    for (unsigned char ch : in.cache_key) state = (state ^ ch) * 0x100000001b3ULL;
    const uint64_t offset = SplitMix64(state);
    auto make = [&] {
      at::Tensor base = MakeBase(in.spec, offset);
      return structured[k] ? ApplyRule(base, in.spec, rule) : base;
    };
    if (cache) {
      InputCache::Entry e = cache->GetOrMake(in.cache_key, make);
      in.base = std::move(e.base);
      in.fingerprint = e.fingerprint;
    } else {
      in.base = make();
    }
  }
  return m;
}

}  // namespace coverage::replay
