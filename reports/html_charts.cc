// The charts section: inline SVG, drawn here so the page needs no script or
// library to show them (Note [Self-contained report] in html.cc).
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "reports/html_parts.h"

namespace coverage::reports::html {
namespace {

struct Bar {
  std::string label;
  int64_t count = 0;
  std::string_view colour;
};

// A vertical histogram with a label under each bar and its count above it.
void WriteColumnChart(Out& out, std::string_view id, std::string_view title, const std::vector<Bar>& bars) {
  constexpr double kHeight = 160, kTop = 20, kBottom = 40, kLeft = 10, kSlot = 64, kWidthFraction = 0.7;
  int64_t peak = 1;
  for (const Bar& bar : bars) peak = std::max(peak, bar.count);
  const double width = kLeft * 2 + kSlot * static_cast<double>(bars.size());
  Put(out,
      "<svg id=\"{}\" class=\"chart\" role=\"img\" aria-labelledby=\"{}-title\" width=\"{:.0f}\" height=\"{:.0f}\" "
      "viewBox=\"0 0 {:.0f} {:.0f}\"><title id=\"{}-title\">{}</title>\n",
      id, id, width, kTop + kHeight + kBottom, width, kTop + kHeight + kBottom, id, E(title));
  for (size_t i = 0; i < bars.size(); ++i) {
    const Bar& bar = bars[i];
    const double h = kHeight * static_cast<double>(bar.count) / static_cast<double>(peak);
    const double x = kLeft + kSlot * static_cast<double>(i);
    const double w = kSlot * kWidthFraction;
    Put(out,
        "<g><title>{}: {}</title><rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"{}\"/>"
        "<text x=\"{:.1f}\" y=\"{:.1f}\" class=\"value\">{}</text><text x=\"{:.1f}\" y=\"{:.1f}\" "
        "class=\"label\">{}</text></g>\n",
        E(bar.label), bar.count, x, kTop + kHeight - h, w, h, bar.colour, x + w / 2, kTop + kHeight - h - 4, bar.count,
        x + w / 2, kTop + kHeight + 16, E(bar.label));
  }
  out += "</svg>\n";
}

void WriteFamilyChart(Out& out, const Report& report) {
  struct Family {
    std::string name;
    int64_t passing = 0, total = 0;
  };
  std::vector<Family> families;
  for (const auto& [family, by_stage] : report.matrix) {
    Family f{FamilyName(family)};
    for (const auto& [stage, counts] : by_stage) {
      f.passing += counts.first;
      f.total += counts.second;
    }
    if (f.total > 0) families.push_back(f);
  }
  out += "<figure>\n<figcaption>Pass rate by family (all stages)</figcaption>\n";
  if (families.empty()) {
    out += "<p class=\"empty\">No results with a model family.</p>\n</figure>\n";
    return;
  }
  std::stable_sort(families.begin(), families.end(),
                   [](const Family& a, const Family& b) { return a.total > b.total; });
  const size_t shown = std::min(families.size(), kMaxFamilyBars);
  constexpr double kLabel = 180, kBarWidth = 360, kRow = 20;
  const double height = kRow * static_cast<double>(shown) + 8;
  Put(out,
      "<svg id=\"family-chart\" class=\"chart\" role=\"img\" aria-labelledby=\"family-chart-title\" width=\"{:.0f}\" "
      "height=\"{:.0f}\" viewBox=\"0 0 {:.0f} {:.0f}\"><title id=\"family-chart-title\">Pass rate by family</title>\n",
      kLabel + kBarWidth + 110, height, kLabel + kBarWidth + 110, height);
  for (size_t i = 0; i < shown; ++i) {
    const Family& f = families[i];
    const double rate = static_cast<double>(f.passing) / static_cast<double>(f.total);
    const double y = kRow * static_cast<double>(i) + 4;
    Put(out,
        "<g><title>{}: {} of {} pass</title><text x=\"{:.0f}\" y=\"{:.1f}\" class=\"family\">{}</text>"
        "<rect x=\"{:.0f}\" y=\"{:.1f}\" width=\"{:.0f}\" height=\"{:.0f}\" class=\"track\"/>"
        "<rect x=\"{:.0f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.0f}\" fill=\"{}\"/>"
        "<text x=\"{:.0f}\" y=\"{:.1f}\" class=\"rate\">{} ({}/{})</text></g>\n",
        E(f.name), f.passing, f.total, kLabel - 6, y + 13, E(Shorten(f.name, 28)), kLabel, y, kBarWidth, kRow - 4,
        kLabel, y, kBarWidth * rate, kRow - 4, RateColour(rate, true), kLabel + kBarWidth + 6, y + 13, Percent(rate),
        f.passing, f.total);
  }
  out += "</svg>\n";
  if (families.size() > shown) {
    Put(out, "<p class=\"more\">The {} largest of {} families.</p>\n", shown, families.size());
  }
  out += "</figure>\n";
}

void WriteErrorChart(Out& out, const Report& report) {
  // Decades of max_rel_err over compared cases; exact zeros and non-finite
  // errors get bars of their own.
  std::map<int, int64_t> decades;
  int64_t zeros = 0, nonfinite = 0;
  for (const CaseEntry& c : report.cases) {
    if (!c.result || !c.result->max_rel_err) continue;
    const double v = std::abs(*c.result->max_rel_err);
    if (!std::isfinite(v)) {
      ++nonfinite;
    } else if (v == 0) {
      ++zeros;
    } else {
      decades[std::clamp(static_cast<int>(std::floor(std::log10(v))), -20, 20)]++;
    }
  }
  out += "<figure>\n<figcaption>Error distribution: max relative error of compared cases</figcaption>\n";
  if (decades.empty() && zeros == 0 && nonfinite == 0) {
    out += "<p class=\"empty\">No compared cases.</p>\n</figure>\n";
    return;
  }
  std::vector<Bar> bars;
  if (zeros > 0) bars.push_back({"0", zeros, "#3a9d5d"});
  if (!decades.empty()) {
    for (int d = decades.begin()->first; d <= decades.rbegin()->first; ++d) {
      auto it = decades.find(d);
      bars.push_back({fmt::format("1e{}", d), it == decades.end() ? 0 : it->second, d < -4 ? "#5b8ec9" : "#d9a520"});
    }
  }
  if (nonfinite > 0) bars.push_back({"inf/nan", nonfinite, "#c94a3f"});
  WriteColumnChart(out, "error-chart", "Cases by decade of max relative error", bars);
  out += "</figure>\n";
}

void WriteLatencyChart(Out& out, const Report& report) {
  struct Bin {
    double upper;  // ratio (warm / baseline warm) below which a case falls in the bin
    std::string_view label, colour;
  };
  static const Bin kBins[] = {
      {0.5, "<0.5x", "#3a9d5d"},    {0.8, "0.5-0.8x", "#6cb784"},    {0.95, "0.8-0.95x", "#a7d3b3"},
      {1.05, "0.95-1.05x", "#bbb"}, {1.25, "1.05-1.25x", "#e8b7a9"}, {2.0, "1.25-2x", "#db7f6a"},
      {INFINITY, ">2x", "#c94a3f"},
  };
  std::vector<int64_t> counts(std::size(kBins), 0);
  int64_t compared = 0;
  for (const CaseEntry& c : report.cases) {
    if (!c.result || !c.baseline) continue;
    const std::optional<double>& warm = c.result->warm_us;
    const std::optional<double>& base = c.baseline->warm_us;
    if (!warm || !base || *base <= 0 || *warm <= 0) continue;
    const double ratio = *warm / *base;
    if (!std::isfinite(ratio)) continue;
    size_t bin = 0;
    while (bin + 1 < std::size(kBins) && ratio >= kBins[bin].upper) ++bin;
    ++counts[bin];
    ++compared;
  }
  out += "<figure>\n<figcaption>Latency change: warm latency over the baseline's</figcaption>\n";
  if (compared == 0) {
    out += "<p class=\"empty\">No cases with a warm latency in both the run and a baseline.</p>\n</figure>\n";
    return;
  }
  std::vector<Bar> bars;
  for (size_t i = 0; i < std::size(kBins); ++i)
    bars.push_back({std::string(kBins[i].label), counts[i], kBins[i].colour});
  WriteColumnChart(out, "latency-chart", "Cases by ratio of warm latency to the baseline's", bars);
  out += "</figure>\n";
}

}  // namespace

void WriteCharts(Out& out, const Report& report) {
  out += "<section id=\"charts\">\n<h2>Charts</h2>\n<div class=\"charts\">\n";
  WriteFamilyChart(out, report);
  WriteErrorChart(out, report);
  WriteLatencyChart(out, report);
  out += "</div>\n</section>\n";
}

}  // namespace coverage::reports::html
