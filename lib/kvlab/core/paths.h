// Where kvlab's default data lives: the shared data folder and files of kvlab's own tree.
#pragma once

#include <string>

namespace kvlab {

// A default path under the shared data folder: $KVLAB_SHARED/<rel> when KVLAB_SHARED is set,
// else ../shared/<rel> (relative to the working directory, as the READMEs run commands from the
// repository root). The task commands' data flags default to these.
std::string shared_default(const std::string& rel);

// A file kvlab ships (data/ruler/wonderwords.json): `path` as given when it exists or is absolute;
// a relative path missing from the working directory is looked up in kvlab's source tree, so the
// commands run from any directory. Returns the path found (or `path` when neither has it).
std::string shipped_file(const std::string& path);

}  // namespace kvlab
