// report_fixture_writer OUT.html [CASES MODELS]: writes the HTML report of
// the realistic fixture (tests/reports/report_fixture.h), the page the
// browser test (tests/browser/report_test.mjs) opens.
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>

#include "reports/report.h"
#include "tests/reports/report_fixture.h"

int main(int argc, char** argv) {
  if (argc != 2 && argc != 4) {
    std::cerr << "usage: report_fixture_writer OUT.html [CASES MODELS]\n";
    return 2;
  }
  const int cases = argc == 4 ? std::atoi(argv[2]) : 200;
  const int models = argc == 4 ? std::atoi(argv[3]) : 20;
  if (cases < 0 || models < 1) {
    std::cerr << "report_fixture_writer: CASES must be >= 0 and MODELS >= 1\n";
    return 2;
  }
  const std::string html = coverage::reports::ReportToHtml(coverage::testing::RealisticReport(cases, models));
  std::ofstream out(argv[1], std::ios::binary);
  out << html;
  out.close();
  if (!out) {
    std::cerr << "report_fixture_writer: cannot write " << argv[1] << "\n";
    return 1;
  }
  std::cout << "wrote " << argv[1] << " (" << html.size() << " bytes, " << cases << " cases, " << models
            << " models)\n";
  return 0;
}
