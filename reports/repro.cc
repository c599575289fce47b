#include "reports/repro.h"

#include <cmath>
#include <sstream>

#include <fmt/format.h>

namespace coverage::reports {
namespace {

std::string PyDType(DType d) {
  switch (d) {
    case DType::kFloat32: return "torch.float32";
    case DType::kFloat64: return "torch.float64";
    case DType::kFloat16: return "torch.float16";
    case DType::kBFloat16: return "torch.bfloat16";
    case DType::kInt8: return "torch.int8";
    case DType::kUInt8: return "torch.uint8";
    case DType::kInt16: return "torch.int16";
    case DType::kInt32: return "torch.int32";
    case DType::kInt64: return "torch.int64";
    case DType::kBool: return "torch.bool";
    case DType::kComplex64: return "torch.complex64";
    case DType::kComplex128: return "torch.complex128";
  }
  return "torch.float32";
}

std::string PyFloat(double v) {
  if (std::isnan(v)) return "float('nan')";
  if (std::isinf(v)) return v > 0 ? "float('inf')" : "float('-inf')";
  return fmt::format("{}", v);
}

template <class T, class F>
std::string PyList(const std::vector<T>& v, F f) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + f(v[i]);
  return out + "]";
}

std::string PyString(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\\' || c == '\'') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      out += fmt::format("\\x{:02x}", static_cast<unsigned char>(c));
      continue;
    }
    out += c;
  }
  return out + "'";
}

// ATen passes these enums as ints; Python's torch.ops wants the objects.
std::string IntArgument(const std::string& name, int64_t v) {
  static const char* kScalarTypes[] = {"torch.uint8",     "torch.int8",       "torch.int16",   "torch.int32",
                                       "torch.int64",     "torch.float16",    "torch.float32", "torch.float64",
                                       "torch.complex32", "torch.complex64",  "torch.complex128", "torch.bool",
                                       "torch.qint8",     "torch.quint8",     "torch.qint32",  "torch.bfloat16"};
  if (name == "dtype" && v >= 0 && v < 16) return kScalarTypes[v];
  if (name == "memory_format") {
    static const char* kFormats[] = {"torch.contiguous_format", "torch.preserve_format", "torch.channels_last",
                                     "torch.channels_last_3d"};
    if (v >= 0 && v < 4) return kFormats[v];
  }
  if (name == "layout" && v == 0) return "torch.strided";
  return std::to_string(v);
}

std::string MakeTensor(const TensorSpec& t) {
  const char* kind = "real";
  switch (t.domain.kind) {
    case ValueDomain::Kind::kReal: kind = "real"; break;
    case ValueDomain::Kind::kNonNegative: kind = "nonnegative"; break;
    case ValueDomain::Kind::kPositive: kind = "positive"; break;
    case ValueDomain::Kind::kUnit: kind = "unit"; break;
    case ValueDomain::Kind::kMask: kind = "mask"; break;
    case ValueDomain::Kind::kInteger: kind = "integer"; break;
    case ValueDomain::Kind::kBool: kind = "bool"; break;
  }
  auto ints = [](int64_t v) { return std::to_string(v); };
  return fmt::format("make({}, {}, {}, {}, '{}', {}, {})", PyList(t.shape, ints), PyList(t.strides, ints),
                     t.storage_offset, PyDType(t.dtype), kind, t.domain.lo, t.domain.hi);
}

std::string Value(const Argument& a) {
  auto ints = [](int64_t v) { return std::to_string(v); };
  switch (a.kind) {
    case Argument::Kind::kNone: return "None";
    case Argument::Kind::kTensor: return MakeTensor(a.tensor);
    case Argument::Kind::kTensorList:
      return PyList(a.tensors, [](const std::optional<TensorSpec>& t) { return t ? MakeTensor(*t) : "None"; });
    case Argument::Kind::kInt: return IntArgument(a.name, a.i);
    case Argument::Kind::kDouble: return PyFloat(a.d);
    case Argument::Kind::kBool: return a.b ? "True" : "False";
    case Argument::Kind::kString: return PyString(a.s);
    case Argument::Kind::kIntList: return PyList(a.ints, ints);
    case Argument::Kind::kDoubleList: return PyList(a.doubles, PyFloat);
    case Argument::Kind::kBoolList: return PyList(a.bools, [](bool b) { return std::string(b ? "True" : "False"); });
    case Argument::Kind::kDevice: return "'__device__'";
  }
  return "None";
}

}  // namespace

std::string PythonRepro(const OpCase& c, uint64_t seed, const std::string& device) {
  std::ostringstream py;
  const std::string op = c.op.substr(c.op.find("::") == std::string::npos ? 0 : c.op.find("::") + 2);
  const std::string ns = c.op.find("::") == std::string::npos ? "aten" : c.op.substr(0, c.op.find("::"));
  py << "# " << c.Summary() << "\n"
     << "import torch\n\n"
     << "DEVICE = " << PyString(device) << "\n"
     << "torch.manual_seed(" << seed << ")\n\n"
     << "def make(shape, stride, offset, dtype, domain, lo, hi):\n"
     << "    # Storage for the strides and offset, filled in the case's value domain.\n"
     << "    n = offset + 1 + sum((s - 1) * st for s, st in zip(shape, stride)) if all(shape) else offset + 1\n"
     << "    if domain == 'integer':\n"
     << "        flat = torch.randint(lo, hi, (n,))\n"
     << "    elif domain == 'bool':\n"
     << "        flat = torch.rand(n) < 0.5\n"
     << "    elif domain == 'unit':\n"
     << "        flat = torch.rand(n)\n"
     << "    elif domain == 'positive':\n"
     << "        flat = 0.5 + 1.5 * torch.rand(n)\n"
     << "    elif domain == 'nonnegative':\n"
     << "        flat = 2 * torch.rand(n)\n"
     << "    elif domain == 'mask' and len(shape) >= 2:\n"
     << "        return torch.full(shape, float('-inf')).triu(1).to(dtype)  # causal additive mask\n"
     << "    else:\n"
     << "        flat = 2 * torch.rand(n) - 1\n"
     << "    return flat.to(dtype).as_strided(shape, stride, offset)\n\n"
     << "def to(v, device):\n"
     << "    if isinstance(v, torch.Tensor):\n"
     << "        return v.to(device)\n"
     << "    if isinstance(v, list):\n"
     << "        return [to(e, device) for e in v]\n"
     << "    return v\n\n"
     << "args = {\n";
  for (const Argument& a : c.args) py << "    " << PyString(a.name) << ": " << Value(a) << ",\n";
  py << "}\n"
     << "op = torch.ops." << ns << "." << op << "." << (c.overload.empty() ? "default" : c.overload) << "\n"
     << "cpu_args = {k: ('cpu' if isinstance(v, str) and v == '__device__' else v) for k, v in args.items()}\n"
     << "dev_args = {k: (DEVICE if isinstance(v, str) and v == '__device__' else to(v, DEVICE)) for k, v in "
        "args.items()}\n"
     << "ref = op(**cpu_args)\n"
     << "out = op(**dev_args)\n"
     << "refs = ref if isinstance(ref, (tuple, list)) else (ref,)\n"
     << "outs = out if isinstance(out, (tuple, list)) else (out,)\n"
     << "for i, (r, o) in enumerate(zip(refs, outs)):\n"
     << "    if isinstance(r, torch.Tensor):\n"
     << "        d = (o.cpu().double() - r.double()).abs().max().item() if r.numel() else 0.0\n"
     << "        print(f'output {i}: shape {tuple(o.shape)} dtype {o.dtype} max abs diff vs cpu {d:.3g}')\n";
  return py.str();
}

}  // namespace coverage::reports
