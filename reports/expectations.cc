#include "reports/report.h"

namespace coverage::reports {}  // namespace coverage::reports
