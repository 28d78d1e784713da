// Where jieba's data comes from: the installed jieba package (Debian's python3-jieba 0.42.1),
// never a copy in this repository. Files read:
//   <dir>/dict.txt                     the prefix dictionary ("word freq tag" per line, ~5 MB)
//   <dir>/finalseg/prob_start.py       HMM start log-probabilities
//   <dir>/finalseg/prob_trans.py       HMM transition log-probabilities
//   <dir>/finalseg/prob_emit.py        HMM emission log-probabilities (~1.3 MB)
// <dir> is $KVLAB_JIEBA_DIR when set, else /usr/lib/python3/dist-packages/jieba.
#pragma once

#include <string>

namespace kvlab::eval {

// $KVLAB_JIEBA_DIR or /usr/lib/python3/dist-packages/jieba.
std::string jieba_default_dir();

// The whole file; a missing file throws kvlab::Error naming it and the fix
// (`apt-get install python3-jieba`, or KVLAB_JIEBA_DIR).
std::string read_jieba_file(const std::string& path);

}  // namespace kvlab::eval
