// `meshtrain launch --hostfile F [...] -- train ...`: supervises an mpirun job over the hosts
// of a hostfile and keeps it going when hosts are lost or come back (docs/multihost.md,
// "Elastic restart"). Before each start it probes the hosts, chooses the largest layout that
// fits those that answer with the job's global batch (cli/launch_layout.h) and starts
// `mpirun -np N ... train ... --dp D --tp T --pp P`; the job's --resume auto takes the newest
// valid checkpoint, resharded to that layout by the trainer. When the job fails (a lost
// host, a killed rank, a watchdog timeout) it starts again on the hosts that still answer;
// when a lost host answers again it stops the job cleanly (SIGUSR1: the step finishes, a
// checkpoint is saved) and starts it again in the larger layout. Each restart is one log line
// and one --metrics record with the recovery time split into detection, restart and
// resharded load.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "cli/commands.h"
#include "cli/launch_layout.h"
#include "cli/launch_process.h"
#include "cli/train_command.h"
#include "core/error.h"
#include "core/write_file.h"
#include "obs/metrics.h"
#include "train/checkpoint.h"

namespace mt::cli {

namespace {

using launch::Choice;
using launch::Host;
using launch::Layout;

struct Flags {
  std::string hostfile, probe = "ssh -o BatchMode=yes -o ConnectTimeout=5 {} true", fence, log;
  std::string mpirun = "mpirun", cluster = "this-host";
  std::vector<std::string> mpirun_args, job;
  int max_restarts = 3;
  double hang_grace_s = 30;
  bool no_grow = false;
};

volatile sig_atomic_t g_stop = 0;
void on_stop_signal(int) { g_stop = 1; }

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::vector<std::string> words_of(const std::string& s) {
  std::istringstream in(s);
  std::vector<std::string> w;
  for (std::string x; in >> x;) w.push_back(x);
  return w;
}

// The job's command, parsed by train's own parser; --dp, --tp and --pp taken out (the
// launcher sets them for each start).
struct JobCommand {
  std::vector<std::string> argv;  // executable, "train", the other flags
  train::TrainOptions options;
  std::optional<int> dp;  // --dp given: the most dp may be
};

JobCommand parse_job(std::vector<std::string> words) {
  if (words.empty())
    fail("launch needs the job's command after --: `meshtrain launch --hostfile F -- train ...`");
  if (words[0] == "train") words.insert(words.begin(), launch::self_executable());
  if (words.size() < 2 || words[1] != "train")
    fail("the job's command '{} {}' is not `[MESHTRAIN] train ...` (launch runs training jobs)",
         words[0], words.size() > 1 ? words[1] : "");
  TrainCommandFlags f;
  CLI::App app{"the job's train command"};
  add_train_command_flags(app, f);
  std::vector<std::string> args(words.begin() + 2, words.end());
  std::vector<std::string> reversed(args.rbegin(), args.rend());
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    fail("the job's train command: {} (see meshtrain train --help)", e.what());
  }
  JobCommand job;
  job.options = train_command_options(f);
  job.dp = f.run.dp;
  const train::TrainOptions& o = job.options;
  if (o.checkpoint_dir.empty() || o.resume != "auto")
    fail(
        "the job needs --checkpoint-dir DIR and --resume auto (each restart goes on from the "
        "newest checkpoint there); it has --checkpoint-dir '{}' --resume '{}'",
        o.checkpoint_dir, o.resume);
  if (o.backend != "mpi" && o.backend != "auto")
    fail(
        "the job's --backend {} cannot run under mpirun across hosts (use --backend mpi, or "
        "leave it out)",
        o.backend);
  job.argv = {words[0], words[1]};
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--dp" || a == "--tp" || a == "--pp") {
      ++i;
      continue;
    }
    if (a.rfind("--dp=", 0) == 0 || a.rfind("--tp=", 0) == 0 || a.rfind("--pp=", 0) == 0) continue;
    job.argv.push_back(a);
  }
  return job;
}

std::string list(const std::vector<std::string>& names) {
  std::string s;
  for (const std::string& n : names) s += (s.empty() ? "" : " ") + n;
  return s.empty() ? "none" : s;
}

// The newest checkpoint whose index reads (the trainer's --resume auto checks more: its
// pieces' checksums; it takes this one unless it is damaged).
int64_t newest_checkpoint_step(const std::string& dir) {
  for (const std::string& c : train::ckpt::list_checkpoints(dir)) {
    try {
      return train::ckpt::read_index(c).step;
    } catch (const Error&) {
    }
  }
  return 0;
}

// The largest step of the metrics file's step rows (0: none, or no file).
int64_t last_metrics_step(const std::string& path) {
  if (path.empty()) return 0;
  std::ifstream in(path);
  int64_t last = 0;
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json row = nlohmann::json::parse(line, nullptr, false);
    if (row.is_object() && row.contains("step") && row["step"].is_number_integer())
      last = std::max(last, row["step"].get<int64_t>());
  }
  return last;
}

// Before a start from the checkpoint of step `from`: the metrics file as the trainer will
// keep it (its step rows through `from`, every event row), so that a step row past `from`
// is this start's, however the trainer rewrites the file. Only a regular file.
void trim_metrics(const std::string& path, int64_t from) {
  std::error_code ec;
  if (path.empty() || !std::filesystem::is_regular_file(path, ec)) return;
  std::string text;
  for (const std::string& row : obs::metrics_rows_through(path, from)) text += row + "\n";
  io::write_file(path, text);
}

void append_line(const std::string& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) fail_run("cannot append to '{}': {}", path, std::strerror(errno));
  const std::string line = text + "\n";
  const bool ok = ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
  ::close(fd);
  if (!ok) fail_run("cannot append to '{}': {}", path, std::strerror(errno));
}

class Launcher {
 public:
  explicit Launcher(const Flags& f)
      : f_(f), job_(parse_job(f.job)), hosts_(launch::read_hostfile(f.hostfile)) {
    if (f.max_restarts < 0) fail("--max-restarts {} must be 0 or more", f.max_restarts);
    if (!(f.hang_grace_s > 0))
      fail("--hang-grace {} must be a positive number of seconds", f.hang_grace_s);
    const train::TrainOptions& o = job_.options;
    int slots = 0;
    for (const Host& h : hosts_) slots += h.slots;
    // cp and ep stay as the job gives them: every layout has them (cli/launch_layout.h).
    cap_ = {job_.dp ? *job_.dp : std::max(1, slots / (o.tp * o.pipeline.pp * o.cp)), o.tp,
            o.pipeline.pp, o.cp, o.ep};
    model_ = launch::planner_step_time(o, f.cluster, &no_model_);
    work_ =
        std::filesystem::temp_directory_path() / ("meshtrain-launch." + std::to_string(::getpid()));
    std::filesystem::create_directories(work_);
  }
  ~Launcher() {
    std::error_code ec;
    std::filesystem::remove_all(work_, ec);
  }
  void run();

 private:
  struct Pending {       // what the next start is a restart after
    std::string reason;  // "failure" or "grow"
    std::vector<std::string> lost, returned;
    int exit_code = 0;
    double ran_s = 0, detect_s = 0;
  };
  void say(const std::string& line) {
    fmt::print(stderr, "launch: {}\n", line);
    if (!f_.log.empty()) append_line(f_.log, "launch: " + line);
  }
  bool answers(const std::string& host) const { return launch::run_for_host(probe_cmd(), host, 5); }
  std::string probe_cmd() const {
    const size_t at = f_.probe.find("{}");
    return at == std::string::npos ? f_.probe
                                   : f_.probe.substr(0, at) + "\"$0\"" + f_.probe.substr(at + 2);
  }
  int slots_of(const std::vector<std::string>& names) const {
    int s = 0;
    for (const Host& h : hosts_)
      if (std::find(names.begin(), names.end(), h.name) != names.end()) s += h.slots;
    return s;
  }

  nlohmann::json restart_record(const Pending& p, const std::vector<std::string>& up,
                                const Layout& l, int64_t from, int64_t steps_lost, double start,
                                double up_at, double first_step_at) const;
  std::string restart_line(const Pending& p, const std::vector<std::string>& up, const Layout& l,
                           const std::string& why, int64_t from, int64_t steps_lost, double start,
                           double up_at, double first_step_at) const;
  // The restart's line (unless said at its first step: line_said) and its metrics record,
  // once the job it started has ended.
  void report(const Pending& p, const std::vector<std::string>& up, const Layout& l,
              const std::string& why, int64_t from, int64_t steps_lost, double start, double up_at,
              double first_step_at, bool line_said) {
    if (!line_said) say(restart_line(p, up, l, why, from, steps_lost, start, up_at, first_step_at));
    ++restarts_;
    records_.push_back(restart_record(p, up, l, from, steps_lost, start, up_at, first_step_at));
    write_records();
  }
  // Every restart record of this launch that the metrics file lacks, appended in order: a
  // start with no checkpoint yet begins the file anew (the trainer keeps event rows only when
  // it resumes), so the records written before the first checkpoint come back here.
  void write_records() const {
    const std::string& path = job_.options.metrics;
    if (path.empty()) return;
    std::set<int64_t> there;
    std::error_code ec;
    if (std::filesystem::is_regular_file(path, ec))
      for (const std::string& row : obs::metrics_rows_through(path, 0)) {
        const nlohmann::json r = nlohmann::json::parse(row, nullptr, false);
        if (r.is_object() && r.value("event", "") == "restart" && r.contains("restart") &&
            r["restart"].is_number_integer())
          there.insert(r["restart"].get<int64_t>());
      }
    for (const nlohmann::json& rec : records_)
      if (!there.count(rec["restart"].get<int64_t>())) append_line(path, rec.dump());
  }

  Flags f_;
  int restarts_ = 0;                     // restarts reported
  std::vector<nlohmann::json> records_;  // their --metrics records
  JobCommand job_;
  std::vector<Host> hosts_;
  Layout cap_;
  launch::StepTimeModel model_;
  std::string no_model_;
  std::filesystem::path work_;
};

double rounded(double s) { return std::round(s * 100) / 100; }

nlohmann::json Launcher::restart_record(const Pending& p, const std::vector<std::string>& up,
                                        const Layout& l, int64_t from, int64_t steps_lost,
                                        double start, double up_at, double first_step_at) const {
  nlohmann::json rec = {
      {"event", "restart"},
      {"restart", restarts_},
      {"reason", p.reason},
      {"hosts", up},
      {"lost_hosts", p.lost},
      {"returned_hosts", p.returned},
      {"layout", {{"dp", l.dp}, {"tp", l.tp}, {"pp", l.pp}, {"cp", l.cp}, {"ep", l.ep}}},
      {"batch", job_.options.batch},
      {"from_step", from},
      {"steps_lost", steps_lost},
      {"previous_exit_code", p.exit_code},
      {"previous_ran_s", rounded(p.ran_s)},
      {"detect_s", rounded(p.detect_s)}};
  rec["restart_s"] = up_at > 0 ? nlohmann::json(rounded(up_at - start)) : nlohmann::json(nullptr);
  rec["load_s"] =
      first_step_at > 0 ? nlohmann::json(rounded(first_step_at - up_at)) : nlohmann::json(nullptr);
  return rec;
}

std::string Launcher::restart_line(const Pending& p, const std::vector<std::string>& up,
                                   const Layout& l, const std::string& why, int64_t from,
                                   int64_t steps_lost, double start, double up_at,
                                   double first_step_at) const {
  const bool grow = p.reason == "grow";
  const auto secs = [](double from_s, double to_s) {
    return to_s > 0 ? fmt::format("{:.1f} s", to_s - from_s) : std::string("-");
  };
  // restarts_ counts those reported; a restart's line is said before its report.
  const int number = restarts_ + 1;
  return fmt::format(
      "restart {}: {} {}; {} host(s) answer ({}); layout {}, batch {} ({}); from checkpoint step "
      "{} ({} step(s) trained again); {} {:.1f} s, restart {}, resharded load {}",
      number, grow ? "host(s) back:" : "lost host(s)", list(grow ? p.returned : p.lost), up.size(),
      list(up), l.text(), job_.options.batch, why, from, steps_lost, grow ? "stop" : "detection",
      p.detect_s, secs(start, up_at), secs(up_at, first_step_at));
}

void Launcher::run() {
  const train::TrainOptions& o = job_.options;
  std::set<std::string> fenced;
  std::optional<Pending> pending;
  int failures = 0;
  bool first = true;
  while (true) {
    std::vector<std::string> up, lost;
    for (const Host& h : hosts_) (answers(h.name) ? up : lost).push_back(h.name);
    for (const std::string& h : lost)
      if (fenced.insert(h).second && !f_.fence.empty()) {
        const size_t at = f_.fence.find("{}");
        launch::run_for_host(at == std::string::npos
                                 ? f_.fence
                                 : f_.fence.substr(0, at) + "\"$0\"" + f_.fence.substr(at + 2),
                             h, 30);
      }
    for (const std::string& h : up) fenced.erase(h);
    const int slots = slots_of(up);
    const std::optional<Choice> choice = launch::choose_layout(o, cap_, slots, model_);
    if (!choice)
      fail_run(
          "no layout fits the hosts that answer: {} of {} ({}) with {} slot(s); the job needs "
          "tp x pp ranks of a divisor of tp {} x pp {}, times cp {} (kept), and a dp dividing "
          "--batch {}{} (bring hosts back, or give the hostfile more slots)",
          up.size(), hosts_.size(), list(up), slots, cap_.tp, cap_.pp, cap_.cp, o.batch,
          cap_.ep > 1 ? fmt::format(" and a multiple of --ep {} (kept)", cap_.ep) : "");
    const Layout l = choice->layout;
    // The hostfile of this start: the hosts that answer, in the hostfile's order.
    std::vector<Host> use;
    for (const Host& h : hosts_)
      if (std::find(up.begin(), up.end(), h.name) != up.end()) use.push_back(h);
    const std::string hostfile = (work_ / "hostfile").string();
    io::write_file(hostfile, launch::hostfile_text(use));
    std::vector<std::string> argv = {f_.mpirun, "--hostfile", hostfile};
    for (const std::string& a : f_.mpirun_args)
      for (const std::string& w : words_of(a)) argv.push_back(w);
    argv.insert(argv.end(), {"-np", std::to_string(l.ranks())});
    argv.insert(argv.end(), job_.argv.begin(), job_.argv.end());
    argv.insert(argv.end(), {"--dp", std::to_string(l.dp), "--tp", std::to_string(l.tp), "--pp",
                             std::to_string(l.pp)});
    const int64_t from = newest_checkpoint_step(o.checkpoint_dir);
    const int64_t done = last_metrics_step(o.metrics);
    const int64_t steps_lost = pending && done > from ? done - from : 0;
    if (first)
      say(fmt::format("starting {} on {} host(s) ({}), batch {} ({}){}{}", l.text(), up.size(),
                      list(up), o.batch, choice->why,
                      lost.empty() ? "" : "; not answering: " + list(lost),
                      model_ ? "" : "; layouts of as many ranks unranked: " + no_model_));
    trim_metrics(o.metrics, from);

    const double start = now_s();
    double up_at = 0, first_step_at = 0, first_sign = 0, grow_seen = 0, last_probe = start;
    bool growing = false, forwarded = false, line_said = false;
    std::vector<std::string> returned;
    std::map<std::string, double> silent_since;
    launch::Job job(argv);
    while (job.pump(0.1, [&](const std::string& line) {
      if (up_at == 0) up_at = now_s();
      fmt::print(stderr, "{}\n", line);
    })) {
      const double t = now_s();
      if (g_stop && !forwarded) {
        say("stopping the job (SIGUSR1 to mpirun: every rank finishes its step, saves and exits 3; "
            "no restart)");
        job.signal(SIGUSR1);
        forwarded = true;
      }
      // The first step of this start: a step row past the checkpoint (the file was trimmed to
      // the checkpoint before the start).
      if (first_step_at == 0 && up_at > 0 && !o.metrics.empty()) {
        if (last_metrics_step(o.metrics) > from) {
          first_step_at = now_s();
          if (pending) {
            say(restart_line(*pending, up, l, choice->why, from, steps_lost, start, up_at,
                             first_step_at));
            line_said = true;
          }
        }
      }
      if (t - last_probe < 1) continue;
      last_probe = t;
      for (const std::string& h : up) {
        if (answers(h)) {
          silent_since.erase(h);
          continue;
        }
        const double since = silent_since.emplace(h, t).first->second;
        if (first_sign == 0) first_sign = since;
        if (t - since >= f_.hang_grace_s) {
          say(fmt::format("host {} has not answered for {:.0f} s (--hang-grace): ending the job", h,
                          t - since));
          job.kill_group();
        }
      }
      // Growing stops the job with SIGUSR1, which a rank takes as "save and stop" once its
      // signal thread runs: after its first step (without --metrics: once it prints).
      const bool stepping = o.metrics.empty() ? up_at > 0 : first_step_at > 0;
      if (!f_.no_grow && !growing && !g_stop && stepping) {
        std::vector<std::string> back;
        for (const std::string& h : lost)
          if (answers(h)) back.push_back(h);
        if (!back.empty()) {
          std::vector<std::string> more = up;
          more.insert(more.end(), back.begin(), back.end());
          const std::optional<Choice> bigger =
              launch::choose_layout(o, cap_, slots_of(more), model_);
          if (bigger && bigger->layout.ranks() > l.ranks()) {
            say(
                fmt::format("host(s) {} answer again: stopping the job after its step (SIGUSR1: "
                            "it saves a checkpoint) to grow to {}",
                            list(back), bigger->layout.text()));
            job.signal(SIGUSR1);
            growing = true;
            grow_seen = t;
            returned = back;
          }
        }
      }
    }
    const double ended = now_s();
    job.kill_group();  // what is left of the job (a lost host's daemon)
    const int rc = job.exit_code();
    // A job that ended within a poll of its first step (a few short steps left after the
    // checkpoint) has its first step seen now: late by at most the poll (0.1 s) and those
    // steps. Without this its restart record had no load time (CI: Elastic.AHostCutOff...,
    // 4 steps of 10 ms after a restart from step 20).
    if (first_step_at == 0 && up_at > 0 && !o.metrics.empty() &&
        last_metrics_step(o.metrics) > from)
      first_step_at = ended;
    if (pending)
      report(*pending, up, l, choice->why, from, steps_lost, start, up_at, first_step_at,
             line_said);
    first = false;
    if (g_stop) {
      if (rc == 0) return;
      throw Error(fmt::format("launch: the job stopped with exit code {} after SIGINT/SIGTERM", rc),
                  rc == 3 ? ExitCode::kStopped : ExitCode::kRunFailure);
    }
    Pending next;
    next.exit_code = rc;
    next.ran_s = ended - start;
    // (the checkpoint, not the metrics: a step without its checkpoint would be lost)
    const int64_t last_step = newest_checkpoint_step(o.checkpoint_dir);
    if (growing && rc != 0 &&
        launch::after_grow_signal(rc, last_step, o.steps) == launch::AfterGrowSignal::kDone) {
      say(fmt::format(
          "the job had trained its last step ({}) when the signal to grow reached it (exit {}): "
          "the run is over",
          last_step, rc));
      return;
    }
    if (growing && rc == 3) {
      next.reason = "grow";
      next.returned = returned;
      next.detect_s = ended - grow_seen;
      pending = next;
      continue;
    }
    if (rc == 0) return;
    if (rc == 2)
      throw Error("launch: the job refused its input (exit 2, its error above); not restarting",
                  ExitCode::kBadInput);
    if (rc == 3) throw Error("launch: the job stopped on request (exit 3)", ExitCode::kStopped);
    say(fmt::format("the job exited with {} after {:.1f} s", rc, ended - start));
    if (failures >= f_.max_restarts)
      fail_run("the job failed (exit {}) and {} restart(s) are used (--max-restarts {}); giving up",
               rc, failures, f_.max_restarts);
    ++failures;
    next.reason = "failure";
    next.detect_s = ended - (first_sign > 0 ? std::min(first_sign, ended) : ended);
    for (const Host& h : hosts_)
      if (std::find(up.begin(), up.end(), h.name) != up.end() && !answers(h.name))
        next.lost.push_back(h.name);
    pending = next;
  }
}

}  // namespace

void register_launch(CLI::App& app) {
  auto f = std::make_shared<Flags>();
  CLI::App* cmd = app.add_subcommand(
      "launch",
      "run an mpirun training job over a hostfile, restarting it on the hosts that answer "
      "(smaller when hosts are lost, larger when they come back) from the newest checkpoint");
  cmd->add_option("--hostfile", f->hostfile, "the hosts, `HOST slots=N` per line")->required();
  cmd->add_option("--probe", f->probe,
                  "a host answers when `CMD HOST` exits 0 within 5 s ({} in CMD: where the host "
                  "goes); namespace hosts: \"scripts/hosts.sh probe --prefix P\"")
      ->capture_default_str();
  cmd->add_option("--fence", f->fence,
                  "run `CMD HOST` on a host found lost, before the restart (its processes would "
                  "never finish): \"scripts/hosts.sh kill --prefix P\"");
  cmd->add_option("--max-restarts", f->max_restarts, "restarts after failures (growing is not one)")
      ->capture_default_str();
  cmd->add_option("--hang-grace", f->hang_grace_s,
                  "end the job when one of its hosts has not answered for S seconds (mpirun can "
                  "wait forever for a lost host's daemon); at least the job's --comm-timeout")
      ->capture_default_str();
  cmd->add_flag("--no-grow", f->no_grow, "never stop the job to grow when a lost host comes back");
  cmd->add_option("--log", f->log, "also append launch's own lines (one per restart) to FILE");
  cmd->add_option("--mpirun", f->mpirun, "the mpirun to run")->capture_default_str();
  cmd->add_option("--mpirun-args", f->mpirun_args,
                  "more mpirun options, as one string (--mpirun-args=\"--oversubscribe ...\")")
      ->allow_extra_args(false);
  cmd->add_option("--cluster", f->cluster,
                  "the planner's cluster (plan --cluster) that ranks layouts using as many ranks")
      ->capture_default_str();
  cmd->add_option("job", f->job, "after --: the job, `train ...` (or `PATH/meshtrain train ...`)")
      ->required();
  cmd->callback([f] {
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
    Launcher(*f).run();
  });
}

}  // namespace mt::cli
