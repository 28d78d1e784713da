// NLTK's Porter stemmer in its default mode, `nltk.stem.porter.PorterStemmer()`
// (mode NLTK_EXTENSIONS; NLTK 3.x nltk/stem/porter.py), which Google's rouge-score uses when
// use_stemmer=True. Steps as in NLTK: the irregular-form pool (sky/skies, dying, news, ...),
// words of <= 2 letters unchanged, then steps 1a, 1b, 1c, 2, 3, 4, 5a, 5b with NLTK's extensions:
//   1a  "ies" of a 4-letter word -> "ie"
//   1b  "ied" -> "ie" (4 letters) or "i"; "eed" -> "ee" when m(stem) > 0; "ed"/"ing" removed
//       when the stem has a vowel, then at->ate, bl->ble, iz->ize, double consonant (not l/s/z)
//       -> single, or +e when m == 1 and *o (NLTK: *o also holds for a 2-letter vowel+consonant)
//   1c  y -> i when preceded by a consonant that is not the first letter
//   2   "alli" -> "al" (then step 2 again), "bli" -> "ble", "fulli" -> "ful", "logi" -> "log"
//   3, 4, 5a, 5b as in the paper
// "Consonant": not a/e/i/o/u, and 'y' only when the letter before it is a vowel or it is first.
// Input: lowercase ASCII (rouge-score hands it tokens of [a-z0-9]); other bytes are letters
// that are neither vowels nor 'y'.
#pragma once

#include <string>

namespace kvlab::eval {

std::string porter_stem(const std::string& word);

}  // namespace kvlab::eval
