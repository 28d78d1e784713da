// The two BPE merge loops, both O(n log n) with a heap over a linked list of symbols so a long
// SentencePiece "word" (Llama 2 has no pre-tokenizer: the whole text is one word) stays fast.
//   bpe_rank:  Hugging Face BPE (tokenizers/src/models/bpe/word.rs): merge the pair with the
//              lowest merges-list rank, ties to the leftmost.
//   bpe_score: SentencePiece BPE as llama.cpp / llama2.c run it: merge the adjacent pair whose
//              concatenation is a vocabulary piece with the highest score, ties to the leftmost.
#include "kvlab/core/check.h"
#include "kvlab/tokenizer/tokenizer_impl.h"

#include <queue>

namespace kvlab {

void Tokenizer::Impl::unknown_char(std::string_view ch, std::vector<int64_t>& out) const {
  if (byte_fallback) {
    for (unsigned char b : ch) {
      if (byte_ids[b] >= 0) {
        out.push_back(byte_ids[b]);
      } else {
        KVLAB_CHECK(unk_id >= 0,
                    "{}: byte 0x{:02X} has no <0x{:02X}> piece and the tokenizer has no unk token",
                    source, b, b);
        out.push_back(unk_id);
      }
    }
    return;
  }
  KVLAB_CHECK(unk_id >= 0, "{}: text piece '{}' is not in the vocabulary and there is no unk token",
              source, std::string(ch));
  // fuse_unk: consecutive unknown chars become one unk (HF BPE), as the caller's last id shows.
  if (fuse_unk && !out.empty() && out.back() == unk_id) return;
  out.push_back(unk_id);
}

namespace {

struct Symbol {
  int64_t id;
  int prev, next;
  size_t start, len;  // byte span in the word (bpe_score looks pieces up by text)
  bool mergeable;     // byte-fallback / unk symbols never merge
};

struct RankMerge {
  int32_t rank;
  int pos;
  int32_t new_id;
  // std::priority_queue is a max-heap: "less" means lower priority.
  bool operator<(const RankMerge& o) const {
    return rank != o.rank ? rank > o.rank : pos > o.pos;
  }
};

struct ScoreMerge {
  float score;
  int left;
  size_t size;  // byte length of the merged piece, to detect stale entries
  int64_t id;
  bool operator<(const ScoreMerge& o) const {
    return score != o.score ? score < o.score : left > o.left;
  }
};

}  // namespace

void Tokenizer::Impl::bpe_rank(std::string_view word, std::vector<int64_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges) {
    auto it = piece_to_id.find(std::string(word));
    if (it != piece_to_id.end()) {
      out.push_back(it->second);
      return;
    }
  }
  std::vector<Symbol> sym;
  sym.reserve(word.size());
  std::vector<int64_t> tmp;
  for (size_t i = 0; i < word.size();) {
    size_t len = 0;
    detail::utf8_next(word, i, &len);
    auto it = piece_to_id.find(std::string(word.substr(i, len)));
    if (it != piece_to_id.end()) {
      sym.push_back({it->second, 0, 0, i, len, true});
    } else {
      tmp.clear();
      if (!sym.empty() && !sym.back().mergeable) tmp.push_back(sym.back().id);  // for fuse_unk
      const size_t before = tmp.size();
      unknown_char(word.substr(i, len), tmp);
      for (size_t k = before; k < tmp.size(); ++k) sym.push_back({tmp[k], 0, 0, i, len, false});
    }
    i += len;
  }
  const int n = static_cast<int>(sym.size());
  for (int i = 0; i < n; ++i) {
    sym[i].prev = i - 1;
    sym[i].next = i + 1 < n ? i + 1 : -1;
  }
  auto lookup = [&](int a, int b) -> const std::pair<int32_t, int32_t>* {
    if (!sym[a].mergeable || !sym[b].mergeable) return nullptr;
    const uint64_t key = (static_cast<uint64_t>(sym[a].id) << 32) | static_cast<uint32_t>(sym[b].id);
    auto it = merges.find(key);
    return it == merges.end() ? nullptr : &it->second;
  };
  std::priority_queue<RankMerge> heap;
  for (int i = 0; i + 1 < n; ++i)
    if (auto* m = lookup(i, i + 1)) heap.push({m->first, i, m->second});
  std::vector<bool> dead(n, false);
  while (!heap.empty()) {
    const RankMerge top = heap.top();
    heap.pop();
    if (dead[top.pos] || sym[top.pos].next < 0) continue;
    const int right = sym[top.pos].next;
    const auto* m = lookup(top.pos, right);
    if (!m || m->second != top.new_id) continue;  // stale: one side was merged since
    Symbol& s = sym[top.pos];
    s.id = top.new_id;
    s.len += sym[right].len;
    s.next = sym[right].next;
    if (s.next >= 0) sym[s.next].prev = top.pos;
    dead[right] = true;
    if (s.prev >= 0)
      if (auto* p = lookup(s.prev, top.pos)) heap.push({p->first, s.prev, p->second});
    if (s.next >= 0)
      if (auto* p = lookup(top.pos, s.next)) heap.push({p->first, top.pos, p->second});
  }
  for (int i = 0; i >= 0 && n > 0; i = sym[i].next) out.push_back(sym[i].id);
}

void Tokenizer::Impl::bpe_score(std::string_view word, std::vector<int64_t>& out) const {
  if (word.empty()) return;
  std::vector<Symbol> sym;
  sym.reserve(word.size());
  for (size_t i = 0; i < word.size();) {
    size_t len = 0;
    detail::utf8_next(word, i, &len);
    sym.push_back({-1, 0, 0, i, len, true});
    i += len;
  }
  const int n = static_cast<int>(sym.size());
  for (int i = 0; i < n; ++i) {
    sym[i].prev = i - 1;
    sym[i].next = i + 1 < n ? i + 1 : -1;
  }
  std::priority_queue<ScoreMerge> heap;
  std::string key;
  auto try_add = [&](int a, int b) {
    if (a < 0 || b < 0) return;
    key.assign(word.substr(sym[a].start, sym[a].len + sym[b].len));
    auto it = piece_to_id.find(key);
    if (it == piece_to_id.end()) return;
    heap.push({scores[it->second], a, key.size(), it->second});
  };
  for (int i = 0; i + 1 < n; ++i) try_add(i, i + 1);
  std::vector<bool> dead(n, false);
  while (!heap.empty()) {
    const ScoreMerge top = heap.top();
    heap.pop();
    const int right = sym[top.left].next;
    if (dead[top.left] || right < 0 || sym[top.left].len + sym[right].len != top.size) continue;
    Symbol& s = sym[top.left];
    s.len += sym[right].len;
    s.next = sym[right].next;
    if (s.next >= 0) sym[s.next].prev = top.left;
    dead[right] = true;
    try_add(s.prev, top.left);
    try_add(top.left, s.next);
  }
  for (int i = 0; i >= 0 && n > 0; i = sym[i].next) {
    const std::string_view piece = word.substr(sym[i].start, sym[i].len);
    auto it = piece_to_id.find(std::string(piece));
    if (it != piece_to_id.end()) {
      out.push_back(it->second);
    } else {
      // Only single characters can be missing (merges produce vocabulary pieces only).
      unknown_char(piece, out);
    }
  }
}

}  // namespace kvlab
