#include "core/profile.h"

namespace mt::profile {

namespace {
thread_local bool t_enabled = false;
thread_local std::map<std::string, Entry> t_entries;
thread_local Scope* t_innermost = nullptr;
}  // namespace

Scope*& innermost() { return t_innermost; }

void enable(bool on) { t_enabled = on; }
bool enabled() { return t_enabled; }
std::map<std::string, Entry>& entries() { return t_entries; }
void reset() { t_entries.clear(); }

}  // namespace mt::profile
