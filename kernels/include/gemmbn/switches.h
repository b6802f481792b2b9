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

}  // namespace gemmbn
