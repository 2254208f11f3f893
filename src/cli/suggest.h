// What `meshtrain` says about a command line it cannot take before CLI11 sees it: a word that
// is no subcommand (`meshtrain trian`) is named, with the nearest subcommand suggested.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace mt::cli {

// Edit distance (insertions, deletions, substitutions, adjacent transpositions) of a and b.
int edit_distance(const std::string& a, const std::string& b);

// The candidate nearest to `word` when it is near enough to be a typo of it (at most a third
// of its letters, at least 2), else "".
std::string nearest(const std::string& word, const std::vector<std::string>& candidates);

// Refuses (mt::Error, exit 2) a first positional word of `args` that names no subcommand of
// `app` (and, inside a subcommand that has subcommands, such as bench, the same one level
// down), naming the word, the nearest subcommand and the list.
void check_subcommand_words(const CLI::App& app, const std::vector<std::string>& args);

}  // namespace mt::cli
