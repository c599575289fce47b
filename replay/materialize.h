// Materialisation: turning an OpCase's argument descriptions into real
// values that keep the op valid. Internal to replay/ (torch types).
//
// Values are deterministic: a tensor's values depend only on its storage
// key (dtype, storage size, value domain: Note [Storage keys] in
// core/op_case.cc), its rank among the arguments with the same key, and the
// seed. They are drawn from one pool of uniform numbers generated once, so
// making a tensor costs one pass over its storage rather than a
// random-number generator call per element, and an InputCache lets cases
// that share a storage (a weight in prefill and decode cases, and its
// transposed view in another op) share the values. See Note [Value domains]
// in materialize.cc.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>

#include "core/op_case.h"
#include "core/result.h"

namespace coverage::replay {

// Content fingerprint of a tensor's bytes (order-sensitive, one parallel
// read pass); used to prove that read-only inputs stayed unchanged.
uint64_t Fingerprint(const at::Tensor& contiguous);

// Recently made input storages (CPU), least recently used dropped first once
// the byte budget is exceeded, each with its fingerprint. One storage larger
// than the whole budget (a vocabulary's embedding table) is kept apart while
// the cases that follow read it, and let go before the first case that does
// not (KeepLargeOnlyFor), so that it never adds to another case's memory. Bases are
// read-only by contract: ops that write an argument get a copy, and a
// backend that writes into one anyway is caught by
// MaterializedCase::VerifyReadOnlyInputs, which evicts the base, so it cannot
// poison later cases. One thread at a time.
class InputCache {
 public:
  struct Entry {
    std::string key;
    at::Tensor base;
    uint64_t fingerprint = 0;
  };
  explicit InputCache(int64_t budget_bytes) : budget_(budget_bytes) {}
  // Fingerprints are computed on demand (fingerprint 0 = not yet known).
  Entry GetOrMake(const std::string& key, const std::function<at::Tensor()>& make);
  void SetFingerprint(const std::string& key, uint64_t fingerprint);
  void Evict(const std::string& key);
  // Lets go of the large storage unless `keys` (one case's inputs) name it.
  void KeepLargeOnlyFor(const std::vector<std::string>& keys);
  int64_t bytes() const { return bytes_; }
  int64_t hits() const { return hits_; }
  int64_t misses() const { return misses_; }

 private:
  int64_t budget_;
  int64_t bytes_ = 0;
  int64_t hits_ = 0, misses_ = 0;
  std::list<Entry> lru_;    // front = most recent
  std::list<Entry> large_;  // at most one, over the budget
  std::unordered_map<std::string, std::list<Entry>::iterator> index_;
};

// Inputs of one case on CPU. Tensors are kept as (storage base, spec) so that
// each run can get a fresh view or copy, on any device, with the recorded
// strides and offset.
class MaterializedCase {
 public:
  // Builds the IValue arguments for one run on `device`. Arguments the op
  // writes always get their own storage; others share read-only storage
  // between runs (and, on the CPU device, with the cache). `to_double`
  // converts floating tensors to float64 (the golden run). `verify` (runs of
  // an untrusted backend) fingerprints shared CPU storage so that
  // VerifyReadOnlyInputs can check it afterwards.
  Result<std::vector<c10::IValue>> Build(c10::Device device, bool to_double, bool verify);

  // Checks that no read-only input storage handed to the backend changed.
  // A backend that wrote into one gets an error naming the argument, and the
  // storage is evicted from the cache. Costs one read pass over those inputs.
  Status VerifyReadOnlyInputs();

  const std::vector<bool>& mutated() const { return mutated_; }

 private:
  friend Result<MaterializedCase> Materialize(const OpCase&, const c10::FunctionSchema&, uint64_t, InputCache*);
  struct TensorInput {
    at::Tensor base;  // CPU storage, storage-numel elements, contiguous
    TensorSpec spec;
    std::string arg_name;
    std::string cache_key;
    uint64_t fingerprint = 0;
    bool shared_with_backend = false;
  };
  // One per schema argument: either a non-tensor IValue or tensor slots.
  struct Slot {
    size_t arg_index = 0;            // into op_case_.args
    std::vector<int> tensor_ids;        // into tensors_, -1 for a None item
    bool optional_list = false;         // Tensor?[]
    bool scalar_list = false;           // Scalar[] (NumberListFor)
  };
  at::Tensor MakeView(int id, c10::Device device, bool fresh, bool to_double, bool verify);

  std::vector<TensorInput> tensors_;
  std::vector<Slot> slots_;
  std::vector<bool> mutated_;  // per schema argument: written by the op
  OpCase op_case_;
  InputCache* cache_ptr_ = nullptr;
  // Device copies of bases, cached per (device, dtype-conversion).
  std::vector<std::pair<std::string, at::Tensor>> cache_;
};

// The IValue of a non-tensor argument (numbers, strings, lists; a device
// argument names `device`); None for kNone and the tensor kinds.
c10::IValue NonTensorIValue(const Argument& a, c10::Device device);

// Whether `schema_arg` is a Scalar[] (`_foreach_div_.ScalarList`'s scalars),
// and the list a kernel of it unboxes: a list of numbers, not the
// float[] or int[] NonTensorIValue makes of a recorded double or int list.
bool IsScalarList(const c10::Argument& schema_arg);
c10::IValue NumberListFor(const c10::IValue& list);

// One tensor with `spec`'s dtype, shape, strides and offset whose values
// follow its domain (Note [Value domains]), deterministic in `name` and
// `seed`: program replay's leaves (inputs, constants).
at::Tensor MakeTensor(const TensorSpec& spec, std::string_view name, uint64_t seed);

// One floating tensor with `spec`'s dtype, shape, strides and offset drawn
// from a normal (mean a, standard deviation b) or uniform ([a, b))
// distribution as a model's initialiser would, deterministic in `stream`:
// program replay's parameters. Values come from a fixed pool of 4M
// standard normal (or uniform) numbers, computed in float and stored in the
// spec's dtype, one parallel pass over the storage: a generator call per
// element made parameter initialisation most of a large model's replay.
enum class InitRule { kNormal, kUniform };
at::Tensor MakeInitialised(const TensorSpec& spec, InitRule rule, double a, double b, uint64_t stream);

// Materialises the inputs of `op_case` for `schema`, reusing bases from
// `cache` when given. Fails (InvalidArgument) when the case does not fit the
// schema or a spec cannot be built.
Result<MaterializedCase> Materialize(const OpCase& op_case, const c10::FunctionSchema& schema, uint64_t seed,
                                     InputCache* cache = nullptr);

}  // namespace coverage::replay
