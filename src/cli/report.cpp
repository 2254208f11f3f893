// `meshtrain report METRICS... -o report.html [--label NAME]... [--trace T] [--plan P]`: one
// self-contained HTML page of one or more runs (obs/report.h, docs/report.md).
#include "obs/report.h"

#include <fmt/format.h>

#include <cstdio>
#include <fstream>
#include <memory>

#include "cli/commands.h"
#include "core/error.h"

namespace mt::cli {

void register_report(CLI::App& app) {
  struct Flags {
    obs::ReportInput in;
    std::string out;
  };
  auto f = std::make_shared<Flags>();
  CLI::App* cmd = app.add_subcommand(
      "report",
      "one offline HTML page of runs: curves, memory, traffic, timeline, plan vs measured");
  cmd->add_option("metrics", f->in.metrics, "metrics files (train --metrics), one per run")
      ->required();
  cmd->add_option("-o,--out", f->out, "the HTML file to write")->required();
  cmd->add_option("--label", f->in.labels, "a name per run, in the order of the files");
  cmd->add_option("--trace", f->in.trace, "a Chrome trace (train --trace, simulate --trace)");
  cmd->add_option("--plan", f->in.plan, "plan --json or simulate --json output: the prediction");
  cmd->add_option("--plan-layout", f->in.plan_layout, "which of the plan's layouts (0: the best)");
  cmd->add_option("--title", f->in.title, "the page's title");
  cmd->callback([f] {
    const nlohmann::json data = obs::report_data(f->in);
    const std::string html = obs::report_html(data);
    obs::write_text_file(f->out, html, "-o");
    fmt::print(stderr, "wrote {} ({} run(s){}{}, {:.0f} KiB)\n", f->out, data["runs"].size(),
               data["trace"].is_null() ? "" : ", pipeline timeline",
               data["plan"].is_null() ? "" : ", plan vs measured",
               static_cast<double>(html.size()) / 1024);
  });
}

}  // namespace mt::cli
