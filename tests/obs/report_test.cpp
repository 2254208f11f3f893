// `meshtrain report`: the page's embedded data is the metrics file's numbers, read back from
// the HTML; bad input is refused; and each kind of page (one run, two runs overlaid, a
// pipeline run with its trace, plan against measured, a mixture of experts, context
// parallelism's bytes, and plan --html) renders in headless
// Chromium with no script error and every chart present with data points and painted pixels,
// a screenshot saved (into $MT_REPORT_SCREENSHOTS when set: docs/report/ keeps them). Without
// Chromium the browser test is skipped with a message (scripts/setup.sh installs Debian's).
#include "obs/report.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "test_util.h"

namespace mt {
namespace {

using nlohmann::json;

std::string read(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

std::vector<json> rows_of(const std::filesystem::path& p) {
  std::vector<json> rows;
  std::ifstream f(p);
  std::string line;
  while (std::getline(f, line)) rows.push_back(json::parse(line));
  return rows;
}

class Report : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::filesystem::path(test::scratch_dir("report"));
    const std::string data = test::demo_tokens(*dir_);
    const std::string common =
        " --model tiny --seq 32 --threads 1 --peak-gflops 250 --data " + data;
    for (const auto& [name, extra] : std::vector<std::pair<std::string, std::string>>{
             {"a", "--n-layer 2 --batch 4 --steps 12 --eval-every 4 --lr 1e-3"},
             {"b", "--n-layer 2 --batch 4 --steps 12 --eval-every 4 --lr 3e-3"},
             {"pp", "--n-layer 4 --batch 8 --steps 4 --pp 2 --dp 2 --microbatches 4 --trace " +
                        path("pp.trace.json")},
             {"cp", "--n-layer 2 --batch 4 --steps 3 --dp 2 --cp 2"}}) {
      const test::RunResult r = test::run_meshtrain("train" + common + " " + extra + " --metrics " +
                                                    path(name + ".jsonl"));
      ASSERT_EQ(r.exit_code, 0) << r.output;
    }
    // A mixture of experts (mixtral-tiny: 4 MoE layers of 8 experts, top 2) whose capacity
    // drops assignments, with both balancing losses.
    const test::RunResult moe = test::run_meshtrain(
        "train --model mixtral-tiny --seq 32 --batch 8 --steps 10 --eval-every 5 --threads 1 "
        "--peak-gflops 250 --moe-capacity-factor 1.25 --moe-aux-loss 0.02 --moe-z-loss 0.001 "
        "--data " +
        data + " --metrics " + path("moe.jsonl"));
    ASSERT_EQ(moe.exit_code, 0) << moe.output;
    write_moe_without_tokens();
    // The prediction of the pp run's layout (stdout alone: run_command adds 2>&1 outside).
    // `this-host` is a calibration in the suite's own cache folder (the fuzz corpus's valid
    // one), not the user's ~/.cache: a fresh machine has none, simulate refused, and this
    // set-up's failure showed as every Report test skipped (a clean-clone CI run).
    const std::filesystem::path cache = *dir_ / "cache";
    std::filesystem::create_directories(cache / "meshtrain");
    std::filesystem::copy_file(
        std::filesystem::path(MT_SOURCE_DIR) / "tests/fuzz/corpus/cluster_file/valid-this-host",
        cache / "meshtrain" / "this-host.json", std::filesystem::copy_options::overwrite_existing);
    std::string sim = "(XDG_CACHE_HOME=" + cache.string() + " ";
    sim += MT_BINARY;
    sim +=
        " simulate --model tiny --n-layer 4 --seq 32 --cluster this-host --gpus 4 --batch 8 "
        "--dtype f32 --dp 2 --pp 2 --microbatches 4 --json 2>/dev/null > ";
    sim += path("sim.json");
    sim += ")";
    const test::RunResult s = test::run_command(sim);
    ASSERT_EQ(s.exit_code, 0) << s.output;
  }
  static std::string path(const std::string& name) { return (*dir_ / name).string(); }
  // The metrics hold each MoE layer's count per expert ("tokens"); metrics written before
  // that field hold only the fewest and most, and the page draws the CV per layer and step
  // instead. A fixture for that older form: the MoE run's rows without "tokens".
  static void write_moe_without_tokens() {
    std::ofstream out(path("moe-old.jsonl"));
    for (json row : rows_of(path("moe.jsonl"))) {
      for (json& l : row["moe"]["layers"]) l.erase("tokens");
      out << row.dump() << "\n";
    }
  }
  static std::filesystem::path* dir_;
};
std::filesystem::path* Report::dir_ = nullptr;

TEST_F(Report, EmbeddedDataIsTheMetricsFilesNumbers) {
  for (const std::string run : {"a", "pp", "cp", "moe"}) {
    const std::string page = path(run + ".html");
    const test::RunResult r = test::run_meshtrain("report " + path(run + ".jsonl") + " -o " + page);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const json d = obs::report_data_of_html(read(page));
    const std::vector<json> rows = rows_of(path(run + ".jsonl"));
    const json& cols = d["runs"][0]["columns"];
    ASSERT_EQ(cols["step"].size(), rows.size());
    // Every number of every row, at its step, exactly (JSON round-trips doubles).
    int64_t compared = 0;
    for (const auto& [key, values] : cols.items())
      for (size_t i = 0; i < rows.size(); ++i) {
        if (rows[i].contains(key)) {
          EXPECT_EQ(values[i].get<double>(), rows[i][key].get<double>()) << key << " row " << i;
          ++compared;
        } else {
          EXPECT_TRUE(values[i].is_null()) << key << " row " << i;
        }
      }
    EXPECT_GE(compared, static_cast<int64_t>(rows.size()) * 12) << run;
    for (const char* key : {"loss", "val_loss", "tokens", "lr", "grad_norm", "tokens_per_s", "mfu"})
      EXPECT_TRUE(cols.contains(key)) << key;
    // The header is the first row's "run", the memory the last row's "memory_by_rank".
    EXPECT_EQ(d["runs"][0]["run"], rows.front()["run"]);
    EXPECT_EQ(d["runs"][0]["memory"], rows.back()["memory_by_rank"]);
    EXPECT_EQ(d["runs"][0]["memory"]["peak_bytes"].size(), run == "pp" || run == "cp" ? 4u : 1u);
    // Bytes by mesh dimension: cp's where the run has context parallelism.
    EXPECT_EQ(cols.contains("cp_bytes"), run == "cp") << run;
    // Mixture of experts: every row's "moe" object, every number equal; null without one.
    const json& moe = d["runs"][0]["moe"];
    if (run != "moe") {
      EXPECT_TRUE(moe.is_null()) << run;
      continue;
    }
    ASSERT_EQ(moe.size(), rows.size());
    for (size_t i = 0; i < rows.size(); ++i) {
      EXPECT_EQ(moe[i], rows[i]["moe"]) << "row " << i;
      EXPECT_EQ(moe[i]["layers"].size(), 4u) << "row " << i;
    }
    EXPECT_GT(rows.back()["moe"]["dropped"].get<double>(), 0);  // the capacity dropped some
    for (const char* key : {"moe_aux_loss", "moe_z_loss"}) EXPECT_TRUE(cols.contains(key)) << key;
  }
}

TEST_F(Report, MetricsRecordTheRunHeader) {
  const json run = rows_of(path("pp.jsonl")).front()["run"];
  EXPECT_NE(run["command"].get<std::string>().find("train --model tiny"), std::string::npos);
  EXPECT_FALSE(run["commit"].get<std::string>().empty());
  EXPECT_EQ(run["layout"]["pp"], 2);
  EXPECT_EQ(run["layout"]["dp"], 2);
  EXPECT_EQ(run["model"]["n_layer"], 4);
  EXPECT_FALSE(run["machine"]["cpu"].get<std::string>().empty());
  EXPECT_EQ(run["tokens_per_step"], 8 * 32);
}

TEST_F(Report, RefusesBadInput) {
  auto refused = [&](const std::string& args, const std::string& says) {
    const test::RunResult r = test::run_meshtrain("report " + args);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.output;
    EXPECT_NE(r.output.find(says), std::string::npos) << args << "\n" << r.output;
  };
  refused(path("missing.jsonl") + " -o " + path("x.html"), "cannot read the metrics file");
  {
    std::ofstream f(path("bad.jsonl"));
    f << R"({"step": 1, "loss": 2})"
      << "\n{not json\n";
  }
  refused(path("bad.jsonl") + " -o " + path("x.html"), "line 2 is not JSON");
  refused(path("a.jsonl") + " " + path("b.jsonl") + " --label one -o " + path("x.html"),
          "--label was given 1 times for 2 metrics files");
  refused(path("a.jsonl") + " --plan " + path("a.jsonl") + " -o " + path("x.html"), "is not JSON");
  refused(path("a.jsonl") + " --trace " + path("sim.json") + " -o " + path("x.html"),
          "has no traceEvents");
}

// ---- the browser
std::string chromium() {
  if (const char* c = std::getenv("MT_CHROMIUM")) return c;
  for (const char* c : {"/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome"})
    if (std::filesystem::exists(c)) return c;
  return "";
}

// An HTML attribute's value as the DOM serialiser escapes it (&quot; &amp; &lt; &gt;).
std::string unescape_attribute(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    bool done = false;
    for (const auto& [entity, ch] : {std::pair<std::string_view, char>{"&quot;", '"'},
                                     {"&amp;", '&'},
                                     {"&lt;", '<'},
                                     {"&gt;", '>'}})
      if (!done && s.compare(i, entity.size(), entity) == 0) {
        out.push_back(ch);
        i += entity.size() - 1;
        done = true;
      }
    if (!done) out.push_back(s[i]);
  }
  return out;
}

struct Kind {
  std::string name, args;           // `report` arguments, or (plan_html) `plan` arguments
  std::vector<std::string> charts;  // every chart the page must hold
  bool plan_html = false;
};

// A heat map's cells as the page drew them (its check's "cells": rows top to bottom) against
// the metrics file: each MoE layer's CV per step, or (with "tokens") its tokens per expert,
// the mean over the steps. The page computes the means in doubles like this does, in the
// same order: equal to 1e-12 relative (the sum of 10 counts of a few hundred each is exact;
// the division rounds once).
void expect_cells_are_the_metrics(const json& cells, const std::vector<json>& rows, bool tokens) {
  const size_t layers = rows.front()["moe"]["layers"].size();
  ASSERT_EQ(cells.size(), layers);
  for (size_t l = 0; l < layers; ++l) {
    if (!tokens) {
      ASSERT_EQ(cells[l].size(), rows.size());
      for (size_t i = 0; i < rows.size(); ++i)
        EXPECT_EQ(cells[l][i].get<double>(), rows[i]["moe"]["layers"][l]["cv"].get<double>())
            << "layer " << l << " row " << i;
      continue;
    }
    const size_t experts = rows.front()["moe"]["layers"][l]["tokens"].size();
    ASSERT_EQ(cells[l].size(), experts);
    for (size_t e = 0; e < experts; ++e) {
      double sum = 0;
      for (const json& row : rows) sum += row["moe"]["layers"][l]["tokens"][e].get<double>();
      const double mean = sum / static_cast<double>(rows.size());
      EXPECT_NEAR(cells[l][e].get<double>(), mean, 1e-12 * mean) << "layer " << l << " e " << e;
    }
  }
}

// plan --html of a Llama 3 8B search: the ranked layouts.
const std::string kPlanArgs =
    "--model llama3-8b --cluster dgx-h100 --gpus 64 --batch 256 --seq 4096 --top 8";

TEST_F(Report, PlanHtmlEmbedsThePlanJson) {
  const std::string page = path("plan.html");
  const test::RunResult r = test::run_meshtrain("plan " + kPlanArgs + " --html " + page);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::string cmd = "(";
  cmd += MT_BINARY;
  cmd += " plan " + kPlanArgs + " --json 2>/dev/null)";
  const test::RunResult j = test::run_command(cmd);
  ASSERT_EQ(j.exit_code, 0) << j.output;
  json expected = json::parse(j.output), got = obs::report_data_of_html(read(page))["ranked"];
  expected.erase("search_s");  // the search's own time differs between the two runs
  got.erase("search_s");
  EXPECT_EQ(got, expected);
  EXPECT_EQ(got["layouts"].size(), 8u);
}

TEST_F(Report, RendersEachKindInChromium) {
  const std::string browser = chromium();
  if (browser.empty())
    GTEST_SKIP() << "no Chromium (install Debian's `chromium`: scripts/setup.sh); the page was "
                    "not rendered";
  const std::vector<std::string> curves = {"loss-step", "loss-tokens", "loss-time", "tokens-per-s",
                                           "mfu",       "lr",          "grad-norm"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), curves.begin(), curves.end());
    return more;
  };
  const std::vector<Kind> kinds = {
      {"single", path("a.jsonl") + " --label 'lr 1e-3'", with({"memory-0"})},
      {"two-runs", path("a.jsonl") + " " + path("b.jsonl") + " --label 'lr 1e-3' --label 'lr 3e-3'",
       with({"memory-0", "memory-1"})},
      {"pipeline", path("pp.jsonl") + " --label 'pp 2 x dp 2' --trace " + path("pp.trace.json"),
       with({"memory-0", "bytes-0", "timeline"})},
      {"plan", path("pp.jsonl") + " --label 'pp 2 x dp 2' --plan " + path("sim.json"),
       with({"memory-0", "bytes-0", "plan-step-time", "plan-bubble", "plan-memory"})},
      {"moe", path("moe.jsonl") + " --label mixtral-tiny",
       with({"memory-0", "moe-experts-0", "moe-cv-0", "moe-tokens-0", "moe-dropped-0", "moe-aux-0",
             "moe-z-0"})},
      {"moe-no-tokens", path("moe-old.jsonl") + " --label 'mixtral-tiny (metrics without tokens)'",
       with({"memory-0", "moe-imbalance-0", "moe-tokens-0", "moe-dropped-0", "moe-aux-0",
             "moe-z-0"})},
      {"cp", path("cp.jsonl") + " --label 'dp 2 x cp 2'", with({"memory-0", "bytes-0"})},
      {"plan-html", kPlanArgs, {"ranked-memory", "ranked-time"}, true}};
  const char* shots_env = std::getenv("MT_REPORT_SCREENSHOTS");
  const std::filesystem::path shots = shots_env ? shots_env : *dir_;
  std::filesystem::create_directories(shots);
  // A profile folder of its own: a Chromium already running on the default profile (another
  // test, another session) would otherwise take the request over and exit.
  const std::string flags =
      " --headless --no-sandbox --disable-gpu --hide-scrollbars "
      "--virtual-time-budget=5000 --enable-logging=stderr --v=0 --user-data-dir=" +
      path("chromium-profile") + " ";
  for (const Kind& k : kinds) {
    const std::string page = path("report-" + k.name + ".html");
    const test::RunResult r = test::run_meshtrain(k.plan_html ? "plan " + k.args + " --html " + page
                                                              : "report " + k.args + " -o " + page);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    // The page after its scripts ran: the check it wrote into <body data-mt-check>, and
    // Chromium's log of the console (an uncaught error is logged as CONSOLE ... Uncaught).
    // A browser that exits before the page's task ran (seen once on a loaded host) is asked
    // again, twice at most; a page whose script fails never writes the check and still fails.
    const std::string key = "data-mt-check=\"";
    test::RunResult dom;
    size_t a = std::string::npos;
    for (int attempt = 0; attempt < 3 && a == std::string::npos; ++attempt) {
      dom =
          test::run_command(browser + flags + "--window-size=1280,1600 --dump-dom file://" + page);
      ASSERT_EQ(dom.exit_code, 0) << dom.output;
      a = dom.output.find(key);
    }
    ASSERT_NE(a, std::string::npos) << k.name << ": the page's script did not finish\n"
                                    << dom.output;
    const json check = json::parse(unescape_attribute(
        dom.output.substr(a + key.size(), dom.output.find('"', a + key.size()) - a - key.size())));
    const std::string text = check.dump();
    EXPECT_TRUE(check["errors"].empty()) << k.name << ": " << check["errors"].dump();
    EXPECT_EQ(dom.output.find("Uncaught"), std::string::npos) << k.name << "\n" << dom.output;
    for (const std::string& id : k.charts) {
      ASSERT_TRUE(check["charts"].contains(id)) << k.name << ": no chart " << id << " in " << text;
      const json& c = check["charts"][id];
      EXPECT_GT(c["points"].get<int>(), 0) << k.name << " " << id;
      // Painted: pixels with a hue in the plot area (grid and axes are grey).
      EXPECT_GT(c["painted"].get<int>(), 100) << k.name << " " << id;
      EXPECT_GT(c["width"].get<int>(), 0) << k.name << " " << id;
    }
    EXPECT_EQ(check["charts"].size(), k.charts.size()) << k.name << ": " << check["charts"].dump();
    if (k.name == "two-runs") {  // overlaid: each run's loss and validation loss
      EXPECT_EQ(check["charts"]["loss-step"]["series"], 4);
    }
    if (k.name == "cp") {  // bytes by mesh dimension: dp and cp (no tp, no pp)
      EXPECT_EQ(check["charts"]["bytes-0"]["series"], 2);
      // The header's layout names cp (the run header has world 4 = dp 2 x cp 2).
      EXPECT_NE(dom.output.find("dp 2 \u00d7 tp 1 \u00d7 pp 1 \u00d7 cp 2"), std::string::npos)
          << dom.output.substr(0, 4000);
    }
    if (k.name == "moe") {  // the heat map: 4 layers x 8 experts of mean tokens
      expect_cells_are_the_metrics(check["charts"]["moe-experts-0"]["cells"],
                                   rows_of(path("moe.jsonl")), true);
    }
    if (k.name == "moe-no-tokens") {  // the heat map: 4 layers x 10 steps of CV
      expect_cells_are_the_metrics(check["charts"]["moe-imbalance-0"]["cells"],
                                   rows_of(path("moe-old.jsonl")), false);
    }
    const int height = check["height"].get<int>() + 16;
    const std::string png = (shots / ("report-" + k.name + ".png")).string();
    std::filesystem::remove(png);
    const test::RunResult shot =
        test::run_command(browser + flags + "--window-size=1280," + std::to_string(height) +
                          " --screenshot=" + png + " file://" + page);
    EXPECT_EQ(shot.exit_code, 0) << shot.output;
    EXPECT_GT(std::filesystem::exists(png) ? std::filesystem::file_size(png) : 0, 10000u) << png;
  }
}

}  // namespace
}  // namespace mt
