#include "cli/suggest.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "core/error.h"

namespace mt::cli {

int edit_distance(const std::string& a, const std::string& b) {
  // Optimal string alignment distance: Levenshtein plus swapping two neighbouring letters
  // (trian -> train is one edit).
  const size_t n = a.size(), m = b.size();
  std::vector<std::vector<int>> d(n + 1, std::vector<int>(m + 1, 0));
  for (size_t i = 0; i <= n; ++i) d[i][0] = static_cast<int>(i);
  for (size_t j = 0; j <= m; ++j) d[0][j] = static_cast<int>(j);
  for (size_t i = 1; i <= n; ++i)
    for (size_t j = 1; j <= m; ++j) {
      const int cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[n][m];
}

std::string nearest(const std::string& word, const std::vector<std::string>& candidates) {
  const int limit = std::max(2, static_cast<int>(word.size()) / 3);
  std::string best;
  int best_d = limit + 1;
  for (const std::string& c : candidates) {
    const int d = edit_distance(word, c);
    if (d < best_d) best = c, best_d = d;
  }
  return best;
}

namespace {

std::vector<std::string> subcommand_names(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; }))
    names.push_back(sub->get_name());
  return names;
}

// The first word of args[from..] that is not an option or an option's value: a subcommand
// of `app` comes before any of its own options, so this is the first argument that is not
// an option.
void check_level(const CLI::App& app, const std::vector<std::string>& args, size_t from,
                 const std::string& path) {
  const std::vector<std::string> names = subcommand_names(app);
  if (names.empty() || from >= args.size()) return;
  const std::string& word = args[from];
  if (word.empty() || word[0] == '-') return;  // --help, --version: CLI11's
  if (std::find(names.begin(), names.end(), word) != names.end()) {
    check_level(*app.get_subcommand(word), args, from + 1, path + " " + word);
    return;
  }
  const std::string near = nearest(word, names);
  fail("'{}' is not a {} command{} (commands: {}; `{} --help` says more)", word, path,
       near.empty() ? std::string() : fmt::format(": did you mean '{}'?", near),
       fmt::join(names, ", "), path);
}

}  // namespace

void check_subcommand_words(const CLI::App& app, const std::vector<std::string>& args) {
  check_level(app, args, 0, "meshtrain");
}

}  // namespace mt::cli
