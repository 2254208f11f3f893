#include "obs/report.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string_view>

#include "core/error.h"

namespace mt::obs {

namespace assets {  // generated at build time (cmake/embed_assets.cmake)
extern const std::string_view uplot_js, uplot_css, report_js, report_css;
}

namespace {

// The metrics keys the page plots, in the order of its columns ("step" first).
const char* const kColumns[] = {
    "step",     "tokens", "loss",         "val_loss",   "lr",         "grad_norm", "tokens_per_s",
    "mfu",      "time_s", "peak_bytes",   "dp_bytes",   "tp_bytes",   "pp_bytes",  "cp_bytes",
    "ep_bytes", "bubble", "moe_aux_loss", "moe_z_loss", "outer_bytes"};

std::string read_text(const std::string& path, const char* what) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("cannot read the {} '{}' (check the path)", what, path);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

nlohmann::json parse_json(const std::string& text, const std::string& path, const char* what) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail("the {} '{}' is not JSON: {}", what, path, e.what());
  }
}

nlohmann::json read_run(const std::string& path, const std::string& label) {
  std::istringstream lines(read_text(path, "metrics file"));
  nlohmann::json cols = nlohmann::json::object();
  for (const char* c : kColumns) cols[c] = nlohmann::json::array();
  nlohmann::json run = nullptr, memory = nullptr;
  // Mixture of experts: each row's "moe" object as it is (null where a row has none).
  nlohmann::json moe = nlohmann::json::array();
  bool any_moe = false;
  std::string line;
  int64_t n = 0, line_no = 0;
  while (std::getline(lines, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json row;
    try {
      row = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      fail("metrics file '{}' line {} is not JSON: {}", path, line_no, e.what());
    }
    if (!row.is_object() || !row.contains("step") || !row["step"].is_number())
      fail("metrics file '{}' line {} has no numeric \"step\" (is it a train --metrics file?)",
           path, line_no);
    for (const char* c : kColumns) {
      const auto it = row.find(c);
      cols[c].push_back(it != row.end() && it->is_number() ? *it : nlohmann::json(nullptr));
    }
    if (row.contains("run") && run.is_null()) run = row["run"];
    if (row.contains("memory_by_rank")) memory = row["memory_by_rank"];
    const auto m = row.find("moe");
    any_moe = any_moe || (m != row.end() && m->is_object());
    moe.push_back(m != row.end() && m->is_object() ? *m : nlohmann::json(nullptr));
    ++n;
  }
  if (n == 0) fail("metrics file '{}' has no rows (did the run write any step?)", path);
  // Columns no row has are left out: the page draws what the file holds.
  nlohmann::json kept = nlohmann::json::object();
  for (auto& [key, values] : cols.items())
    if (std::any_of(values.begin(), values.end(), [](const auto& v) { return !v.is_null(); }))
      kept[key] = values;
  return {{"label", label},   {"file", path},    {"run", run},
          {"memory", memory}, {"columns", kept}, {"moe", any_moe ? moe : nlohmann::json(nullptr)}};
}

nlohmann::json read_trace(const std::string& path) {
  const nlohmann::json t = parse_json(read_text(path, "trace"), path, "trace");
  const nlohmann::json& list = t.is_object() && t.contains("traceEvents") ? t["traceEvents"] : t;
  if (!list.is_array()) fail("the trace '{}' has no traceEvents list (a Chrome trace JSON?)", path);
  nlohmann::json rank = nlohmann::json::array(), cat = rank, name = rank, start = rank, dur = rank;
  int64_t lanes = 0;
  for (const auto& e : list) {
    if (!e.is_object() || e.value("ph", "") != "X") continue;
    const int64_t r = e.value("tid", int64_t{0});
    lanes = std::max(lanes, r + 1);
    rank.push_back(r);
    cat.push_back(e.value("cat", ""));
    name.push_back(e.value("name", ""));
    start.push_back(e.value("ts", 0.0) * 1e-3);  // microseconds -> ms
    dur.push_back(e.value("dur", 0.0) * 1e-3);
  }
  if (rank.empty()) fail("the trace '{}' has no complete (\"ph\": \"X\") events", path);
  return {{"file", path}, {"lanes", lanes},    {"rank", rank}, {"cat", cat},
          {"name", name}, {"start_ms", start}, {"dur_ms", dur}};
}

nlohmann::json read_plan(const std::string& path, int layout) {
  const nlohmann::json p = parse_json(read_text(path, "plan"), path, "plan");
  if (!p.is_object() || !p.contains("layouts") || !p["layouts"].is_array() || p["layouts"].empty())
    fail("the plan '{}' has no \"layouts\" (write it with plan --json or simulate --json)", path);
  if (layout < 0 || layout >= static_cast<int>(p["layouts"].size()))
    fail("--plan-layout {} is not among the plan's {} layouts (0 is the best)", layout,
         p["layouts"].size());
  const nlohmann::json& l = p["layouts"][static_cast<size_t>(layout)];
  nlohmann::json out = {{"file", path}, {"job", p.value("job", nlohmann::json(nullptr))}};
  for (const char* k : {"dp", "tp", "pp", "cp", "zero", "schedule", "microbatches", "step_time_s",
                        "tokens_per_s", "mfu", "bubble_fraction", "memory_bytes_per_gpu", "time_s"})
    out[k] = l.value(k, nlohmann::json(nullptr));
  return out;
}

}  // namespace

nlohmann::json report_data(const ReportInput& in) {
  if (in.metrics.empty()) fail("report needs at least one metrics file (train --metrics FILE)");
  if (!in.labels.empty() && in.labels.size() != in.metrics.size())
    fail("--label was given {} times for {} metrics files (give one per file, or none)",
         in.labels.size(), in.metrics.size());
  nlohmann::json d = {{"title", in.title}, {"runs", nlohmann::json::array()}};
  for (size_t i = 0; i < in.metrics.size(); ++i)
    d["runs"].push_back(read_run(
        in.metrics[i],
        in.labels.empty() ? std::filesystem::path(in.metrics[i]).stem().string() : in.labels[i]));
  d["trace"] = in.trace.empty() ? nlohmann::json(nullptr) : read_trace(in.trace);
  d["plan"] = in.plan.empty() ? nlohmann::json(nullptr) : read_plan(in.plan, in.plan_layout);
  return d;
}

std::string report_html(const nlohmann::json& data) {
  // Inside <script>, "</script>" or "<!--" in a string would end or confuse the element:
  // every '<' goes in as \u003c, which JSON.parse reads back as '<'.
  std::string json;
  for (char c : data.dump()) json += c == '<' ? std::string("\\u003c") : std::string(1, c);
  std::string title;
  for (char c : data.value("title", std::string("meshtrain report")))
    title += c == '<' ? std::string("&lt;") : c == '&' ? std::string("&amp;") : std::string(1, c);
  if (title.empty()) title = "meshtrain report";
  std::string html;
  html += "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>" + title +
          "</title>\n<style>\n";
  html += assets::uplot_css;
  html += "\n</style>\n<style>\n";
  html += assets::report_css;
  html +=
      "\n</style></head>\n<body>\n<header id=\"mt-header\"></header>\n<main "
      "id=\"mt-charts\"></main>\n";
  html += "<script type=\"application/json\" id=\"mt-data\">" + json + "</script>\n<script>\n";
  html += assets::uplot_js;
  html += "\n</script>\n<script>\n";
  html += assets::report_js;
  html += "\n</script>\n</body></html>\n";
  return html;
}

std::string plan_html(const nlohmann::json& plan_json, const std::string& title) {
  return report_html({{"title", title},
                      {"runs", nlohmann::json::array()},
                      {"trace", nullptr},
                      {"plan", nullptr},
                      {"ranked", plan_json}});
}

void write_text_file(const std::string& path, const std::string& text, const char* flag) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream o(tmp, std::ios::binary);
    if (!o) fail("{} '{}': cannot write (check that its folder exists)", flag, path);
    o << text;
    if (!o) fail("{} '{}': cannot write", flag, path);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    fail("{} '{}': cannot rename '{}' to it", flag, path, tmp);
}

nlohmann::json report_data_of_html(const std::string& html) {
  const std::string open = "<script type=\"application/json\" id=\"mt-data\">";
  const size_t a = html.find(open);
  const size_t b = a == std::string::npos ? a : html.find("</script>", a);
  if (b == std::string::npos) fail("the page has no embedded report data (mt-data)");
  return nlohmann::json::parse(html.substr(a + open.size(), b - a - open.size()));
}

}  // namespace mt::obs
