// The encode / decode pipeline of kvlab::Tokenizer, in the order Hugging Face `tokenizers`
// runs it: added tokens split out -> normalizer per segment -> pre-tokenizer -> BPE model ->
// post-processor (BOS). Decoding runs the decoder chain over the token pieces.
// File formats are parsed in tokenizer_load.cpp; the merge loops live in bpe.cpp.
#include "kvlab/tokenizer/tokenizer.h"

#include "kvlab/core/check.h"
#include "kvlab/tokenizer/tokenizer_impl.h"

#include <algorithm>
#include <unordered_map>

namespace kvlab {

Tokenizer::Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}

void Tokenizer::Impl::finalize() {
  const auto n = static_cast<int64_t>(pieces.size());
  KVLAB_CHECK(n > 0, "{}: the vocabulary is empty", source);
  KVLAB_CHECK(n < (int64_t{1} << 31), "{}: vocabulary of {} pieces is too large", source, n);
  if (piece_to_id.empty()) {
    piece_to_id.reserve(pieces.size());
    for (int64_t i = 0; i < n; ++i) piece_to_id.emplace(pieces[i], i);
  }
  special.assign(pieces.size(), 0);
  for (const auto& t : added) {
    KVLAB_CHECK(t.id >= 0 && t.id < n, "{}: added token '{}' has id {} outside the vocabulary [0, {})",
                source, t.content, t.id, n);
    KVLAB_CHECK(!t.content.empty(), "{}: added token {} has empty content", source, t.id);
    if (t.special) special[t.id] = 1;
  }
  byte_ids.fill(-1);
  for (int b = 0; b < 256; ++b) {
    auto it = piece_to_id.find(fmt::format("<0x{:02X}>", b));
    if (it != piece_to_id.end()) byte_ids[b] = it->second;
  }
  for (int64_t id : {bos, eos, unk_id})
    KVLAB_CHECK(id >= -1 && id < n, "{}: special token id {} outside the vocabulary [0, {})", source,
                id, n);
  for (const auto* v : {&prefix_ids, &suffix_ids})
    for (int64_t id : *v)
      KVLAB_CHECK(id >= 0 && id < n, "{}: post-processor token id {} outside the vocabulary [0, {})",
                  source, id, n);
  if (algo == Algo::ScoreBpe)
    KVLAB_CHECK(scores.size() == pieces.size(), "{}: {} scores for {} pieces", source,
                scores.size(), pieces.size());
  chunk_at_space_marker = false;
  if (!byte_level) {
    const std::string marker = "\xe2\x96\x81";
    chunk_at_space_marker = std::none_of(pieces.begin(), pieces.end(), [&](const std::string& p) {
      size_t i = 0;
      while (p.compare(i, marker.size(), marker) == 0) i += marker.size();
      return p.find(marker, i) != std::string::npos;
    });
  }
  // Longest first, so the added-token scan below takes the longest match at a position.
  std::stable_sort(added.begin(), added.end(), [](const auto& a, const auto& b) {
    return a.content.size() > b.content.size();
  });
  for (auto& v : added_by_byte) v.clear();
  for (size_t i = 0; i < added.size(); ++i)
    added_by_byte[static_cast<unsigned char>(added[i].content[0])].push_back(static_cast<uint32_t>(i));
}

namespace {

bool is_word_byte(unsigned char c) { return std::isalnum(c) || c == '_' || c >= 0x80; }

struct Segment {
  size_t start, len;  // bytes in the text
  int64_t added_id;   // -1 for plain text
};

// Leftmost-longest matches of the added tokens (HF's AddedVocabulary); lstrip / rstrip make a
// token swallow the whitespace beside it.
std::vector<Segment> split_added(const Tokenizer::Impl& m, std::string_view text) {
  const auto& added = m.added;
  std::vector<Segment> segs;
  size_t plain_start = 0;
  for (size_t i = 0; i < text.size();) {
    const detail::AddedToken* hit = nullptr;
    for (uint32_t k : m.added_by_byte[static_cast<unsigned char>(text[i])]) {  // longest first
      const detail::AddedToken& t = added[k];
      if (t.content.size() > text.size() - i) continue;
      if (text.compare(i, t.content.size(), t.content) != 0) continue;
      if (t.single_word) {
        const size_t e = i + t.content.size();
        if ((i > 0 && is_word_byte(text[i - 1])) || (e < text.size() && is_word_byte(text[e])))
          continue;
      }
      hit = &t;
      break;
    }
    if (!hit) {
      ++i;
      continue;
    }
    size_t s = i, e = i + hit->content.size();
    if (hit->lstrip)
      while (s > plain_start && std::isspace(static_cast<unsigned char>(text[s - 1]))) --s;
    if (hit->rstrip)
      while (e < text.size() && std::isspace(static_cast<unsigned char>(text[e]))) ++e;
    if (s > plain_start) segs.push_back({plain_start, s - plain_start, -1});
    segs.push_back({s, e - s, hit->id});
    plain_start = i = e;
  }
  if (plain_start < text.size()) segs.push_back({plain_start, text.size() - plain_start, -1});
  return segs;
}

// "▁a▁▁b" -> "▁a", "▁▁b": cut before each "▁" that follows a char other than "▁".
std::vector<std::string> chunk_before_space_marker(const std::string& s) {
  static const std::string marker = "\xe2\x96\x81";
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t p = s.find(marker); p != std::string::npos; p = s.find(marker, p + marker.size())) {
    const bool after_marker = p >= marker.size() && s.compare(p - marker.size(), marker.size(), marker) == 0;
    if (p > start && !after_marker) {
      out.push_back(s.substr(start, p - start));
      start = p;
    }
  }
  out.push_back(s.substr(start));
  return out;
}

bool is_byte_piece(const std::string& t, unsigned* value) {
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return false;
  unsigned v = 0;
  for (int k = 3; k < 5; ++k) {
    const char c = t[k];
    v <<= 4;
    if (c >= '0' && c <= '9') v |= c - '0';
    else if (c >= 'A' && c <= 'F') v |= c - 'A' + 10;
    else if (c >= 'a' && c <= 'f') v |= c - 'a' + 10;
    else return false;
  }
  *value = v;
  return true;
}

void run_decoder(const detail::DecoderStep& st, std::vector<std::string>& toks) {
  using K = detail::DecoderStep::Kind;
  switch (st.kind) {
    case K::ByteLevel: {
      std::string bytes;
      for (const auto& t : toks) {
        for (size_t i = 0; i < t.size();) {
          size_t len = 0;
          const char32_t cp = detail::utf8_next(t, i, &len);
          const int b = detail::byte_from_unicode(cp);
          if (b >= 0) bytes += static_cast<char>(b);
          else bytes.append(t, i, len);
          i += len;
        }
      }
      toks.assign(1, detail::utf8_lossy(bytes));
      break;
    }
    case K::Replace:
      for (auto& t : toks) t = detail::normalize_replace(t, st.a, st.b);
      break;
    case K::ByteFallback: {
      std::vector<std::string> out;
      std::string pending;
      size_t n_pending = 0;
      auto flush = [&] {
        if (n_pending == 0) return;
        if (detail::utf8_valid(pending)) {
          out.push_back(pending);
        } else {
          for (size_t k = 0; k < n_pending; ++k) out.emplace_back("\xEF\xBF\xBD");
        }
        pending.clear();
        n_pending = 0;
      };
      for (auto& t : toks) {
        unsigned v = 0;
        if (is_byte_piece(t, &v)) {
          pending += static_cast<char>(v);
          ++n_pending;
        } else {
          flush();
          out.push_back(std::move(t));
        }
      }
      flush();
      toks = std::move(out);
      break;
    }
    case K::Fuse: {
      std::string all;
      for (const auto& t : toks) all += t;
      toks.assign(1, std::move(all));
      break;
    }
    case K::Strip:
      for (auto& t : toks) {
        for (int k = 0; k < st.start && t.compare(0, st.a.size(), st.a) == 0 && !st.a.empty(); ++k)
          t.erase(0, st.a.size());
        for (int k = 0; k < st.stop && !st.a.empty() && t.size() >= st.a.size() &&
                        t.compare(t.size() - st.a.size(), st.a.size(), st.a) == 0;
             ++k)
          t.erase(t.size() - st.a.size());
      }
      break;
    case K::Metaspace:
      for (size_t i = 0; i < toks.size(); ++i) {
        auto& t = toks[i];
        t = detail::normalize_replace(t, st.a, " ");
        if (i == 0 && st.prepend_first && !t.empty() && t[0] == ' ') t.erase(0, 1);
      }
      break;
  }
}

}  // namespace

std::vector<int64_t> Tokenizer::encode(std::string_view text, bool add_bos) const {
  const Impl& m = *impl_;
  std::vector<int64_t> ids;
  if (add_bos) ids = m.prefix_ids;
  // Byte-level pre-tokens repeat a lot ("Ġthe"); caching them per call keeps encode const and
  // thread-safe while making long texts several times faster.
  std::unordered_map<std::string, std::vector<int64_t>> cache;
  std::vector<int64_t> tmp;
  for (const Segment& seg : split_added(m, text)) {
    if (seg.added_id >= 0) {
      ids.push_back(seg.added_id);
      continue;
    }
    std::string norm(text.substr(seg.start, seg.len));
    for (const auto& n : m.normalizers) {
      if (n.kind == detail::NormalizerStep::Kind::Prepend && !norm.empty()) norm = n.a + norm;
      else if (n.kind == detail::NormalizerStep::Kind::Replace)
        norm = detail::normalize_replace(norm, n.a, n.b);
    }
    std::vector<std::string> words;
    if (!m.pre_tokenizers.empty()) words = detail::pre_tokenize(m.pre_tokenizers, norm, seg.start == 0);
    else if (m.chunk_at_space_marker) words = chunk_before_space_marker(norm);
    else words.push_back(std::move(norm));
    for (const auto& w : words) {
      const bool cacheable = w.size() <= 64;
      if (cacheable) {
        auto it = cache.find(w);
        if (it != cache.end()) {
          ids.insert(ids.end(), it->second.begin(), it->second.end());
          continue;
        }
      }
      tmp.clear();
      if (m.algo == Impl::Algo::ScoreBpe) m.bpe_score(w, tmp);
      else m.bpe_rank(w, tmp);
      ids.insert(ids.end(), tmp.begin(), tmp.end());
      if (cacheable) cache.emplace(w, tmp);
    }
  }
  if (add_bos) ids.insert(ids.end(), m.suffix_ids.begin(), m.suffix_ids.end());
  return ids;
}

std::string Tokenizer::decode(const std::vector<int64_t>& ids, bool skip_special) const {
  const Impl& m = *impl_;
  std::vector<std::string> toks;
  toks.reserve(ids.size());
  for (int64_t id : ids) {
    KVLAB_CHECK(id >= 0 && id < vocab_size(), "{}: cannot decode token id {} (vocabulary size {})",
                m.source, id, vocab_size());
    if (skip_special && m.special[id]) continue;
    toks.push_back(m.pieces[id]);
  }
  if (m.decoders.empty()) {
    // HF joins pieces with spaces when a tokenizer has no decoder.
    std::string out;
    for (size_t i = 0; i < toks.size(); ++i) out += (i ? " " : "") + toks[i];
    return out;
  }
  for (const auto& st : m.decoders) run_decoder(st, toks);
  std::string out;
  for (const auto& t : toks) out += t;
  return out;
}

std::string Tokenizer::token_text(int64_t id) const {
  KVLAB_CHECK(id >= 0 && id < vocab_size(), "{}: token id {} outside the vocabulary [0, {})",
              impl_->source, id, vocab_size());
  return impl_->pieces[id];
}

int64_t Tokenizer::bos_id() const { return impl_->bos; }
int64_t Tokenizer::eos_id() const { return impl_->eos; }
int64_t Tokenizer::vocab_size() const { return static_cast<int64_t>(impl_->pieces.size()); }
std::string Tokenizer::kind() const { return impl_->kind; }
const std::string& Tokenizer::source() const { return impl_->source; }

bool Tokenizer::is_special(int64_t id) const {
  return id >= 0 && id < vocab_size() && impl_->special[id];
}

int64_t Tokenizer::token_id(std::string_view piece) const {
  auto it = impl_->piece_to_id.find(std::string(piece));
  return it == impl_->piece_to_id.end() ? -1 : it->second;
}

}  // namespace kvlab
