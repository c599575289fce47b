// The index rules of Note [Value domains] (replay/materialize.cc): an
// integer argument that indexes a dimension (embedding's indices, gather's
// index, index's indices, nll_loss's target, ...) takes that whole
// dimension as its range, so a replay reads every row a model could. The
// unit stage's inputs, program replay's leaves and the repro script apply
// the same rules. Torch-free.
#pragma once

#include <cstdint>
#include <vector>

#include "core/op_case.h"

namespace coverage {

// Gives every index argument of `c` with an integer domain the range of the
// dimension it indexes: [0, size), or [-size, size) where negative indices
// are allowed (aten::index) and the recorded range had some.
void IndexRules(OpCase& c);

// For each tensor argument of `op_case` in flattening order (a tensor, then
// each item of a tensor list: the order of ProgramCall::inputs), the size of
// the dimension it indexes under IndexRules, or 0 where it indexes none.
// Program replay gives an integer leaf with no recorded range the range of
// its uses as an index.
std::vector<int64_t> IndexedSizes(const OpCase& op_case);

}  // namespace coverage
