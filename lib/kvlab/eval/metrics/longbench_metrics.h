// LongBench's per-answer metrics, reproducing THUDM/LongBench LongBench/metrics.py at commit
// 2e00731f exactly, quirks included (a "more correct" value is a wrong value here).
// Strings are UTF-8; Python works on code points, and so do these where it matters.
//
// normalize_answer(s)      lower() -> drop string.punctuation (ASCII) -> re.sub(r"\b(a|an|the)\b",
//                          " ") -> " ".join(split()); `\b`/`\w` and split() are Unicode-aware
// normalize_zh_answer(s)   lower() -> drop ASCII and the listed CJK punctuation -> "".join(split())
// f1_score(p, g)           common = Counter(p) & Counter(g); 0 when nothing in common, else
//                          P = same/len(p), R = same/len(g), F1 = (2 * P * R) / (P + R)
// qa_f1_score              f1 of normalize_answer(...).split()
// qa_f1_zh_score           f1 of [normalize_zh_answer(t) for t in jieba.cut(...)], empty dropped
// rouge_score              rouge_pypi.h: ROUGE-L F of the `rouge` package; 0.0 where it raises
//                          (empty text, only '.', or Python's recursion limit in `_recon`)
// rouge_zh_score           rouge_score(" ".join(jieba.cut(pred)), " ".join(jieba.cut(gt)))
// classification_score     em = classes that are substrings of the prediction; then the loop
//                          `for t in em: if t in gt and t != gt: em.remove(t)` that edits the
//                          list it iterates (it skips the element after each removal); score
//                          1/len(em) when gt is in em, else 0
// retrieval_score(_zh)     id = first "Paragraph (\d+)" / "段落(\d+)" of the ground truth (none:
//                          IndexError in Python, kvlab::Error here); numbers = re.findall(r"\d+",
//                          pred), where \d is any Unicode digit (Nd: "１２" is a number, and it
//                          is not equal to "12"); score = (#numbers equal to id as strings) /
//                          #numbers, 0 without numbers
// count_score              the same against the ground truth string itself
// code_sim_score           first line of pred.lstrip('\n').split('\n') with no '`', '#' or '//'
//                          (else ""), then fuzz.ratio(line, gt) / 100 (difflib.h: an integer
//                          percentage, equal strings 100 before empty ones 0)
// Chinese metrics load jieba on first use (jieba.h); a missing jieba install throws.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace kvlab::eval {

std::string normalize_answer(std::string_view s);
std::string normalize_zh_answer(std::string_view s);
double f1_score(const std::vector<std::string>& prediction,
                const std::vector<std::string>& ground_truth);

double qa_f1_score(std::string_view prediction, std::string_view ground_truth);
double qa_f1_zh_score(std::string_view prediction, std::string_view ground_truth);
double rouge_score(std::string_view prediction, std::string_view ground_truth);
double rouge_zh_score(std::string_view prediction, std::string_view ground_truth);
double classification_score(std::string_view prediction, std::string_view ground_truth,
                            const std::vector<std::string>& all_classes);
double retrieval_score(std::string_view prediction, std::string_view ground_truth);
double retrieval_zh_score(std::string_view prediction, std::string_view ground_truth);
double count_score(std::string_view prediction, std::string_view ground_truth);
double code_sim_score(std::string_view prediction, std::string_view ground_truth);

// Python frames below rouge's `_recon` when eval.py's scorer calls rouge_score: <module>,
// scorer, rouge_score, Rouge.get_scores, _get_avg_scores, <lambda>, rouge_l_summary_level,
// _union_lcs, _recon_lcs (rouge_zh_score adds itself: 10). Measured with CPython 3.11: a
// one-sentence prediction equal to its reference scores 0.999999995 up to 990 words and 0.0
// from 991 (rouge_zh_score: up to 989 words).
constexpr int kEvalPyFramesBelowRecon = 9;

}  // namespace kvlab::eval
