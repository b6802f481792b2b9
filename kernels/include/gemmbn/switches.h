// The environment switches that force a choice a rule would make (GEMMBN_FINISH_CLAIMS=0|1,
// GEMMBN_STATISTICS_SOURCE=epilogue|y, ...; README.md lists them), read at each call for tests and A/B runs.
#pragma once

#include <cstdlib>

namespace gemmbn {

// The first character of the variable `name` where it is set and not empty, else '\0' (the rule decides).
inline char forced_choice(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value[0] : '\0';
}

// The integer the variable `name` starts with where it is set and not empty, else `unset` (A/B runs' rows and shares).
inline long integer_switch(const char* name, long unset) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? std::strtol(value, nullptr, 10) : unset;
}

}  // namespace gemmbn
