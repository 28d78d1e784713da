// ROUGE-1/2/L F1 of Google's `rouge-score` 0.1.2 (rouge_score/rouge_scorer.py, tokenize.py),
// `RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=...).score(target, prediction)`,
// as H2O / CaM-style XSUM evaluation uses it.
//
// Tokenizer (DefaultTokenizer -> tokenize.tokenize):
//   text.lower() (Python's full Unicode lowercase), every run of characters outside [a-z0-9]
//   becomes a space, split on whitespace; with use_stemmer, tokens longer than 3 characters go
//   through NLTK's Porter stemmer (porter.h); empty tokens are dropped.
// rougeN:  Counter of n-gram tuples; overlap = sum over target n-grams of min(counts);
//          P = overlap / max(#prediction n-grams, 1), R = overlap / max(#target n-grams, 1)
// rougeL:  LCS length of the token lists; P = lcs / len(prediction), R = lcs / len(target);
//          0 when either list is empty
// F1 (scoring.fmeasure): 2 * P * R / (P + R) when P + R > 0, else 0.0.
// (rougeLsum is not implemented.)
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace kvlab::eval {

struct RougeScore {
  double precision = 0, recall = 0, fmeasure = 0;
};

struct GoogleRouge {
  RougeScore rouge1, rouge2, rougeL;
};

// tokenize.tokenize(text, stemmer); text is UTF-8.
std::vector<std::string> google_rouge_tokenize(std::string_view text, bool use_stemmer);

// rougeL of two token lists already made (the LCS scoring above).
RougeScore google_rouge_l(const std::vector<std::string>& target, const std::vector<std::string>& prediction);

// RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer).score(target, prediction).
GoogleRouge google_rouge(std::string_view target, std::string_view prediction, bool use_stemmer);

}  // namespace kvlab::eval
