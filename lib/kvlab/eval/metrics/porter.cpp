#include "kvlab/eval/metrics/porter.h"

#include <functional>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace kvlab::eval {

namespace {

bool is_vowel_letter(char c) { return c == 'a' || c == 'e' || c == 'i' || c == 'o' || c == 'u'; }

// _is_consonant(word, i)
bool is_consonant(const std::string& w, size_t i) {
  if (is_vowel_letter(w[i])) return false;
  if (w[i] == 'y') {
    bool negate = false;
    while (i > 0 && w[i] == 'y') {
      negate = !negate;
      --i;
    }
    return (!is_vowel_letter(w[i])) != negate;
  }
  return true;
}

// _measure(stem): the number of "vc" in the consonant/vowel pattern.
int measure(const std::string& s) {
  int m = 0;
  for (size_t i = 0; i + 1 < s.size(); ++i)
    if (!is_consonant(s, i) && is_consonant(s, i + 1)) ++m;
  return m;
}

bool contains_vowel(const std::string& s) {
  for (size_t i = 0; i < s.size(); ++i)
    if (!is_consonant(s, i)) return true;
  return false;
}

bool ends_with(const std::string& w, std::string_view suf) {
  return w.size() >= suf.size() && w.compare(w.size() - suf.size(), suf.size(), suf) == 0;
}

std::string cut(const std::string& w, size_t n) { return w.substr(0, w.size() - n); }

bool ends_double_consonant(const std::string& w) {
  return w.size() >= 2 && w[w.size() - 1] == w[w.size() - 2] && is_consonant(w, w.size() - 1);
}

// _ends_cvc (*o), with NLTK's extension for 2-letter words.
bool ends_cvc(const std::string& w) {
  const size_t n = w.size();
  if (n >= 3 && is_consonant(w, n - 3) && !is_consonant(w, n - 2) && is_consonant(w, n - 1) &&
      w[n - 1] != 'w' && w[n - 1] != 'x' && w[n - 1] != 'y')
    return true;
  return n == 2 && !is_consonant(w, 0) && is_consonant(w, 1);
}

struct Rule {
  std::string suffix;  // "*d": ends with a double consonant
  std::string replacement;
  std::function<bool(const std::string&)> condition;  // null: unconditional
};

// _apply_rule_list: the first rule whose suffix matches decides (applied or not).
std::string apply_rules(const std::string& w, const std::vector<Rule>& rules) {
  for (const Rule& r : rules) {
    if (r.suffix == "*d" && ends_double_consonant(w)) {
      std::string stem = cut(w, 2);
      return (!r.condition || r.condition(stem)) ? stem + r.replacement : w;
    }
    if (ends_with(w, r.suffix)) {
      std::string stem = cut(w, r.suffix.size());
      return (!r.condition || r.condition(stem)) ? stem + r.replacement : w;
    }
  }
  return w;
}

bool positive_measure(const std::string& s) { return measure(s) > 0; }
bool measure_gt_1(const std::string& s) { return measure(s) > 1; }

std::string step1a(const std::string& w) {
  if (ends_with(w, "ies") && w.size() == 4) return cut(w, 3) + "ie";
  return apply_rules(w, {{"sses", "ss", nullptr}, {"ies", "i", nullptr}, {"ss", "ss", nullptr},
                         {"s", "", nullptr}});
}

std::string step1b(const std::string& w) {
  if (ends_with(w, "ied")) return cut(w, 3) + (w.size() == 4 ? "ie" : "i");
  if (ends_with(w, "eed")) {
    std::string stem = cut(w, 3);
    return measure(stem) > 0 ? stem + "ee" : w;
  }
  std::string inter;
  bool ok = false;
  for (std::string_view suf : {std::string_view("ed"), std::string_view("ing")}) {
    if (ends_with(w, suf)) {
      inter = cut(w, suf.size());
      if (contains_vowel(inter)) {
        ok = true;
        break;
      }
    }
  }
  if (!ok) return w;
  const char last = inter.empty() ? '\0' : inter.back();
  return apply_rules(
      inter, {{"at", "ate", nullptr},
              {"bl", "ble", nullptr},
              {"iz", "ize", nullptr},
              {"*d", std::string(1, last),
               [last](const std::string&) { return last != 'l' && last != 's' && last != 'z'; }},
              {"", "e", [](const std::string& s) { return measure(s) == 1 && ends_cvc(s); }}});
}

std::string step1c(const std::string& w) {
  return apply_rules(w, {{"y", "i", [](const std::string& s) {
                            return s.size() > 1 && is_consonant(s, s.size() - 1);
                          }}});
}

std::string step2(const std::string& w) {
  if (ends_with(w, "alli") && positive_measure(cut(w, 4))) return step2(cut(w, 4) + "al");
  const std::string word = w;
  return apply_rules(
      w, {{"ational", "ate", positive_measure}, {"tional", "tion", positive_measure},
          {"enci", "ence", positive_measure},   {"anci", "ance", positive_measure},
          {"izer", "ize", positive_measure},    {"bli", "ble", positive_measure},
          {"alli", "al", positive_measure},     {"entli", "ent", positive_measure},
          {"eli", "e", positive_measure},       {"ousli", "ous", positive_measure},
          {"ization", "ize", positive_measure}, {"ation", "ate", positive_measure},
          {"ator", "ate", positive_measure},    {"alism", "al", positive_measure},
          {"iveness", "ive", positive_measure}, {"fulness", "ful", positive_measure},
          {"ousness", "ous", positive_measure}, {"aliti", "al", positive_measure},
          {"iviti", "ive", positive_measure},   {"biliti", "ble", positive_measure},
          {"fulli", "ful", positive_measure},
          // ("logi", "log", lambda stem: self._has_positive_measure(word[:-3]))
          {"logi", "log", [word](const std::string&) { return positive_measure(cut(word, 3)); }}});
}

std::string step3(const std::string& w) {
  return apply_rules(w, {{"icate", "ic", positive_measure}, {"ative", "", positive_measure},
                         {"alize", "al", positive_measure}, {"iciti", "ic", positive_measure},
                         {"ical", "ic", positive_measure},  {"ful", "", positive_measure},
                         {"ness", "", positive_measure}});
}

std::string step4(const std::string& w) {
  return apply_rules(
      w, {{"al", "", measure_gt_1},   {"ance", "", measure_gt_1}, {"ence", "", measure_gt_1},
          {"er", "", measure_gt_1},   {"ic", "", measure_gt_1},   {"able", "", measure_gt_1},
          {"ible", "", measure_gt_1}, {"ant", "", measure_gt_1},  {"ement", "", measure_gt_1},
          {"ment", "", measure_gt_1}, {"ent", "", measure_gt_1},
          {"ion", "",
           [](const std::string& s) {
             return measure(s) > 1 && !s.empty() && (s.back() == 's' || s.back() == 't');
           }},
          {"ou", "", measure_gt_1},   {"ism", "", measure_gt_1},  {"ate", "", measure_gt_1},
          {"iti", "", measure_gt_1},  {"ous", "", measure_gt_1},  {"ive", "", measure_gt_1},
          {"ize", "", measure_gt_1}});
}

std::string step5a(const std::string& w) {
  if (ends_with(w, "e")) {
    std::string stem = cut(w, 1);
    if (measure(stem) > 1) return stem;
    if (measure(stem) == 1 && !ends_cvc(stem)) return stem;
  }
  return w;
}

std::string step5b(const std::string& w) {
  const std::string word = w;
  return apply_rules(w, {{"ll", "l", [word](const std::string&) { return measure(cut(word, 1)) > 1; }}});
}

}  // namespace

std::string porter_stem(const std::string& word) {
  static const std::unordered_map<std::string, std::string> pool = {
      {"sky", "sky"},       {"skies", "sky"},         {"dying", "die"},    {"lying", "lie"},
      {"tying", "tie"},     {"news", "news"},         {"innings", "inning"}, {"inning", "inning"},
      {"outings", "outing"}, {"outing", "outing"},    {"cannings", "canning"},
      {"canning", "canning"}, {"howe", "howe"},       {"proceed", "proceed"}, {"exceed", "exceed"},
      {"succeed", "succeed"}};
  std::string stem = word;
  for (char& c : stem)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c + 32);
  if (auto it = pool.find(stem); it != pool.end()) return it->second;
  if (word.size() <= 2) return stem;
  stem = step1a(stem);
  stem = step1b(stem);
  stem = step1c(stem);
  stem = step2(stem);
  stem = step3(stem);
  stem = step4(stem);
  stem = step5a(stem);
  stem = step5b(stem);
  return stem;
}

}  // namespace kvlab::eval
