#!/usr/bin/env python3
"""Writes tests/fixtures/eval_metrics/golden.json: expected values of the end-to-end benchmark
metrics, computed by the Python originals that lib/kvlab/eval/metrics/ reproduces.

  - LongBench metrics.py / eval.py (THUDM/LongBench, commit 2e00731f): the functions below are
    copied verbatim from LongBench/metrics.py and LongBench/eval.py as the reference being
    reproduced (only `scorer`/`scorer_e` take dataset2metric as a global, as in eval.py).
  - the PyPI packages they use: rouge 1.0.1, fuzzywuzzy 0.18.0 (pure-Python difflib path: no
    python-Levenshtein, as in LongBench's requirements.txt), jieba 0.42.1 (the same files as
    Debian's python3-jieba 0.42.1-3, checked below by the dictionary's md5), numpy
  - Google's rouge-score 0.1.2 (ROUGE-1/2/L F1, default tokenizer, use_stemmer False and True;
    NLTK's Porter stemmer)

Inputs: real-looking predictions built from the answers in ../shared/data/longbench/*.jsonl
(multi_news, multifieldqa_zh, passage_retrieval_zh) plus adversarial strings.

Run (pinned versions in data_scripts/requirements.txt):
  python3 -m venv /tmp/gvenv && /tmp/gvenv/bin/pip install -r data_scripts/requirements.txt
  /tmp/gvenv/bin/python data_scripts/make_eval_metrics_golden.py [--shared ../shared]

Python's recursion limit matters: the `rouge` package reads its LCS back recursively and
LongBench returns 0.0 when that raises RecursionError. Every metric here is called at the
Python stack depth eval.py calls it from (see call_as_eval_py), so the goldens carry eval.py's
thresholds; threshold cases check it.
"""
import argparse
import difflib
import hashlib
import json
import logging
import math
import os
import random
import re
import string
import sys
from collections import Counter

import jieba
import nltk
import numpy as np
from fuzzywuzzy import fuzz
from rouge import Rouge
from rouge_score import rouge_scorer
from nltk.stem import porter

jieba.setLogLevel(logging.WARNING)

DEBIAN_JIEBA_DICT_MD5 = "897a1f17ca8c08caa37a36f92e2da441"  # python3-jieba 0.42.1-3 dict.txt

# ---------------------------------------------------------------------------------------------
# Verbatim from THUDM/LongBench LongBench/metrics.py @ 2e00731f (the reference reproduced).
# ---------------------------------------------------------------------------------------------

def normalize_answer(s):
    """Lower text and remove punctuation, articles and extra whitespace."""

    def remove_articles(text):
        return re.sub(r"\b(a|an|the)\b", " ", text)

    def white_space_fix(text):
        return " ".join(text.split())

    def remove_punc(text):
        exclude = set(string.punctuation)
        return "".join(ch for ch in text if ch not in exclude)

    def lower(text):
        return text.lower()

    return white_space_fix(remove_articles(remove_punc(lower(s))))


def normalize_zh_answer(s):
    """Lower text and remove punctuation, extra whitespace."""

    def white_space_fix(text):
        return "".join(text.split())

    def remove_punc(text):
        cn_punctuation = "！？｡。＂＃＄％＆＇（）＊＋，－／：；＜＝＞＠［＼］＾＿｀｛｜｝～｟｠｢｣､、〃》「」『』【】〔〕〖〗〘〙〚〛〜〝〞〟〰〾〿–—‘’‛“”„‟…‧﹏."
        all_punctuation = set(string.punctuation + cn_punctuation)
        return "".join(ch for ch in text if ch not in all_punctuation)

    def lower(text):
        return text.lower()

    return white_space_fix(remove_punc(lower(s)))

def count_score(prediction, ground_truth, **kwargs):
    numbers = re.findall(r"\d+", prediction)
    right_num = 0
    for number in numbers:
        if str(number) == str(ground_truth):
            right_num += 1
    final_score = 0.0 if len(numbers) == 0 else right_num / len(numbers)
    return float(final_score)

def retrieval_score(prediction, ground_truth, **kwargs):
    pattern = r'Paragraph (\d+)'
    matches = re.findall(pattern, ground_truth)
    ground_truth_id = matches[0]
    numbers = re.findall(r"\d+", prediction)
    right_num = 0
    for number in numbers:
        if str(number) == str(ground_truth_id):
            right_num += 1
    final_score = 0.0 if len(numbers) == 0 else right_num / len(numbers)
    return float(final_score)

def retrieval_zh_score(prediction, ground_truth, **kwargs):
    pattern = r'段落(\d+)'
    matches = re.findall(pattern, ground_truth)
    ground_truth_id = matches[0]
    numbers = re.findall(r"\d+", prediction)
    right_num = 0
    for number in numbers:
        if str(number) == str(ground_truth_id):
            right_num += 1
    final_score = 0.0 if len(numbers) == 0 else right_num / len(numbers)
    return float(final_score)

def code_sim_score(prediction, ground_truth, **kwargs):
    all_lines = prediction.lstrip('\n').split('\n')
    prediction = ""
    for line in all_lines:
        if ('`' not in line) and ('#' not in line) and ('//' not in line):
            prediction = line
            break
    return (fuzz.ratio(prediction, ground_truth) / 100)

def classification_score(prediction, ground_truth, **kwargs):
    em_match_list = []
    all_classes = kwargs["all_classes"]
    for class_name in all_classes:
        if class_name in prediction:
            em_match_list.append(class_name)
    for match_term in em_match_list:
        if match_term in ground_truth and match_term != ground_truth:
            em_match_list.remove(match_term)
    if ground_truth in em_match_list:
        score = (1.0 / len(em_match_list))
    else:
        score = 0.0
    return score
    
def rouge_score(prediction, ground_truth, **kwargs):
    rouge = Rouge()
    try:
        scores = rouge.get_scores([prediction], [ground_truth], avg=True)
    except:
        return 0.0
    return scores["rouge-l"]["f"]

def rouge_zh_score(prediction, ground_truth, **kwargs):
    prediction = " ".join(list(jieba.cut(prediction, cut_all=False)))
    ground_truth = " ".join(list(jieba.cut(ground_truth, cut_all=False))) 
    score = rouge_score(prediction, ground_truth)
    return score

def f1_score(prediction, ground_truth, **kwargs):
    common = Counter(prediction) & Counter(ground_truth)
    num_same = sum(common.values())
    if num_same == 0:
        return 0
    precision = 1.0 * num_same / len(prediction)
    recall = 1.0 * num_same / len(ground_truth)
    f1 = (2 * precision * recall) / (precision + recall)
    return f1

def qa_f1_score(prediction, ground_truth, **kwargs):
    normalized_prediction = normalize_answer(prediction)
    normalized_ground_truth = normalize_answer(ground_truth)

    prediction_tokens = normalized_prediction.split()
    ground_truth_tokens = normalized_ground_truth.split()
    return f1_score(prediction_tokens, ground_truth_tokens)


def qa_f1_zh_score(prediction, ground_truth, **kwargs):
    prediction_tokens = list(jieba.cut(prediction, cut_all=False))
    ground_truth_tokens = list(jieba.cut(ground_truth, cut_all=False))
    prediction_tokens = [normalize_zh_answer(token) for token in prediction_tokens]
    ground_truth_tokens = [normalize_zh_answer(token) for token in ground_truth_tokens]
    prediction_tokens = [token for token in prediction_tokens if len(token) > 0]
    ground_truth_tokens = [token for token in ground_truth_tokens if len(token) > 0]
    return f1_score(prediction_tokens, ground_truth_tokens)

# ---------------------------------------------------------------------------------------------
# Verbatim from THUDM/LongBench LongBench/eval.py @ 2e00731f.
# ---------------------------------------------------------------------------------------------

dataset2metric = {
    "narrativeqa": qa_f1_score,
    "qasper": qa_f1_score,
    "multifieldqa_en": qa_f1_score,
    "multifieldqa_zh": qa_f1_zh_score,
    "hotpotqa": qa_f1_score,
    "2wikimqa": qa_f1_score,
    "musique": qa_f1_score,
    "dureader": rouge_zh_score,
    "gov_report": rouge_score,
    "qmsum": rouge_score,
    "multi_news": rouge_score,
    "vcsum": rouge_zh_score,
    "trec": classification_score,
    "triviaqa": qa_f1_score,
    "samsum": rouge_score,
    "lsht": classification_score,
    "passage_retrieval_en": retrieval_score,
    "passage_count": count_score,
    "passage_retrieval_zh": retrieval_zh_score,
    "lcc": code_sim_score,
    "repobench-p": code_sim_score,
}

def scorer_e(dataset, predictions, answers, lengths, all_classes):
    scores = {"0-4k": [], "4-8k": [], "8k+": []}
    for (prediction, ground_truths, length) in zip(predictions, answers, lengths):
        score = 0.
        if dataset in ["trec", "triviaqa", "samsum", "lsht"]:
            prediction = prediction.lstrip('\n').split('\n')[0]
        for ground_truth in ground_truths:
            score = max(score, dataset2metric[dataset](prediction, ground_truth, all_classes=all_classes))
        if length < 4000:
            scores["0-4k"].append(score)
        elif length < 8000:
            scores["4-8k"].append(score)
        else:
            scores["8k+"].append(score)
    for key in scores.keys():
        scores[key] = round(100 * np.mean(scores[key]), 2)
    return scores

def scorer(dataset, predictions, answers, all_classes):
    total_score = 0.
    for (prediction, ground_truths) in zip(predictions, answers):
        score = 0.
        if dataset in ["trec", "triviaqa", "samsum", "lsht"]:
            prediction = prediction.lstrip('\n').split('\n')[0]
        for ground_truth in ground_truths:
            score = max(score, dataset2metric[dataset](prediction, ground_truth, all_classes=all_classes))
        total_score += score
    return round(100 * total_score / len(predictions), 2)

# ---------------------------------------------------------------------------------------------
# Calling at eval.py's stack depth.
# ---------------------------------------------------------------------------------------------

# Under `python eval.py` the stack is <module> (depth 1) -> scorer (2) -> metric (3) -> ...,
# with the default recursion limit 1000. call_as_eval_py(caller_depth, fn, ...) runs fn as if
# called from the eval.py frame at caller_depth (1: <module> calling scorer/scorer_e, 2: scorer
# calling a metric) by shifting the recursion limit by the difference in depth, so rouge's
# recursive `_recon` fails exactly where it fails under eval.py.
DEFAULT_RECURSION_LIMIT = 1000


def stack_depth():
    """Depth of the caller's frame (<module> = 1)."""
    depth, f = 0, sys._getframe(1)
    while f is not None:
        depth += 1
        f = f.f_back
    return depth


def call_as_eval_py(caller_depth, fn, *args, **kwargs):
    here = stack_depth()  # this function's frame, which makes the call
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(DEFAULT_RECURSION_LIMIT + here - caller_depth)
    try:
        return fn(*args, **kwargs)
    finally:
        sys.setrecursionlimit(old)


METRICS = {f.__name__: f for f in (qa_f1_score, qa_f1_zh_score, rouge_score, rouge_zh_score,
                                   classification_score, retrieval_score, retrieval_zh_score,
                                   count_score, code_sim_score)}


def metric_value(name, prediction, ground_truth, all_classes=None):
    """metric(prediction, gt, all_classes=...) as eval.py's scorer (depth 2) calls it."""
    return call_as_eval_py(2, METRICS[name], prediction, ground_truth, all_classes=all_classes)


# ---------------------------------------------------------------------------------------------
# Inputs.
# ---------------------------------------------------------------------------------------------

TREC_CLASSES = [
    "Abbreviation", "Expression abbreviated", "Animal", "Organ of body", "Color",
    "Invention, book and other creative piece", "Currency name", "Disease and medicine", "Event",
    "Food", "Musical instrument", "Language", "Letter like a-z", "Other entity", "Plant",
    "Product", "Religion", "Sport", "Element and substance", "Symbols and sign",
    "Techniques and method", "Equivalent term", "Vehicle", "Word with a special property",
    "Definition of something", "Description of something", "Manner of an action", "Reason",
    "Group or organization of persons", "Individual", "Title of a person",
    "Description of a person", "Other location", "City", "Country", "Mountain", "State",
    "Postcode or other code", "Number of something", "Date", "Distance, linear measure", "Price",
    "Order, rank", "Other number", "Lasting time of something", "Percent, fraction", "Speed",
    "Temperature", "Size, area and volume", "Weight",
]
LSHT_CLASSES = ["农业、农村", "军事", "文化、休闲娱乐", "体育", "体育产业", "财经、财政、金融", "教育",
                "科技", "医药、卫生", "政治", "社会", "交通", "环境", "法律、司法", "经济", "国际",
                "资源", "健康", "文化"]


def read_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def sentences_of(text):
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+", text) if s.strip()]


def summary_variants(rng, gt, other):
    """Model-like summaries of a reference: partial, reordered, noisy, off-topic."""
    sents = sentences_of(gt)
    shuffled = sents[:]
    rng.shuffle(shuffled)
    words = gt.split()
    dropped = " ".join(w for w in words if rng.random() > 0.3)
    return [
        " ".join(sents[: max(1, len(sents) // 3)]),
        "Here is a summary of the news: " + " ".join(shuffled[:4]),
        gt.lower(),
        dropped,
        "\n\n" + " ".join(sents[:2]) + "\n" + other[:200],
        other,
        gt,  # identical: 0.999999995
        gt.replace(".", ","),  # one sentence
    ]


def qa_pairs(rng, multi_news):
    """English short-answer pairs (narrativeqa/hotpotqa-like) cut from the multi_news answers."""
    out = []
    for rec in multi_news[:12]:
        words = re.findall(r"[A-Za-z][A-Za-z'-]*", rec["answers"][0])
        i = rng.randrange(0, max(1, len(words) - 6))
        gt = " ".join(words[i:i + rng.randint(1, 5)])
        other = " ".join(words[i + 7:i + 10])
        out += [
            (gt, gt),
            (f"The answer is {gt}.", gt),
            (gt.upper() + "!!!", gt),
            (f"I think it is {other}, not {gt}", gt),
            (other, gt),
        ]
    return out


ADVERSARIAL_QA = [
    ("", "Paris"), ("Paris", ""), ("", ""), ("   ", "Paris"), ("!!!...,,,", "Paris"),
    ("the a an", "the"), ("a", "an"), ("The Eiffel Tower", "the eiffel tower"),
    ("an apple a day", "apple day"), ("theater", "the ater"), ("the_cat sat", "thecat sat"),
    ("l'année dernière", "lannée dernière"), ("co-operate", "cooperate"),
    ("ΟΔΟΣ ΟΔΟΣ.Α", "οδος οδοσα"), ("ΣΑΣ Σ ΑΣ'Α", "σας σ ας'α"), ("İstanbul", "i̇stanbul"),
    ("KELVIN K", "kelvin k"), ("Ünïcödé Straße", "ünïcödé strasse"),
    ("北京 is the capital", "北京"), ("１２３ apples", "123 apples"), ("a\u00a0the\u3000an b", "b"),
    ("the\tcat\nsat\r\non the mat", "cat sat on mat"), ("théâtre the âtre", "théâtre âtre"),
    ("Donald Trump Donald Trump", "Donald Trump"), ("x " * 300, "x"),
    ("a.the,an;b", "b"), ("ǅungla", "ǆungla"), ("ⅠⅡⅢ", "ⅰⅱⅲ"),
]

ZH_ADVERSARIAL = [
    ("", "北京大学"), ("北京大学", ""), ("", ""), ("。。！？", "北京大学"), ("   \n", "北京大学"),
    ("北京大学", "北京大学"), ("答案是北京大学。", "北京大学"), ("北京 大学", "北京大学"),
    ("２０２０年", "2020年"), ("2020年3月", "2020年3月"), ("iPhone手机和iPad", "iPhone手机"),
    ("C++和Python编程", "Python编程"), ("增长了3.5%左右", "3.5%"), ("AT&T公司", "AT&T"),
    ("我爱北京天安门\r\n天安门上太阳升", "天安门"), ("他来到了网易杭研大厦", "网易杭研大厦"),
    ("小明硕士毕业于中国科学院计算所，后在日本京都大学深造", "中国科学院计算所"),
    ("《红楼梦》的作者是曹雪芹", "曹雪芹"), ("「你好」，世界！", "你好世界"),
    ("Ｈｅｌｌｏ世界", "hello世界"), ("😀北京😀", "北京"), ("一二三四五六七八九十", "一二三"),
]

CODE_CASES = [
    ("    return x + 1", "    return x + 1"),
    ("\n\n    return x + 1\n", "    return x + 1"),
    ("# compute\n    return x + 1", "    return x + 1"),
    ("```python\n    return x+1\n```", "    return x + 1"),
    ("// comment\nint y = x * 2;", "int y = x * 2;"),
    ("int y = x * 2; // twice", "int y = x * 2;"),
    ("", ""),
    ("", "return 0;"),
    ("# only comments\n// and more\n`x`", ""),
    ("# only comments\n// and more", "return 0;"),
    ("return 0;", ""),
    ("\n", "\n"),
    ("  self.assertEqual(result, expected)", "        self.assertEqual(result, expected)"),
    ("for (int i = 0; i < n; ++i) {", "for (int i = 0; i < n; i++) {"),
    ("print('héllo wörld')", "print('hello world')"),
    ("    x = {\"键\": 1}", "    x = {\"key\": 1}"),
    ("\r\nvalue = compute(a, b)\r\n", "value = compute(a, b)"),
    ("def f(a, b):", "def g(a, b, c):"),
]


def long_code_pairs(rng):
    """Lines of >= 200 characters, so difflib's autojunk drops popular characters of b."""
    out = []
    for k in range(8):
        names = ["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta"]
        args = ", ".join(f"{rng.choice(names)}_{i}={rng.randint(0, 99)}" for i in range(18))
        gt = f"    result_{k} = self.model.forward({args})"
        pred = gt
        for _ in range(rng.randint(1, 12)):
            i = rng.randrange(len(pred))
            op = rng.random()
            if op < 0.4:
                pred = pred[:i] + pred[i + 1:]
            elif op < 0.8:
                pred = pred[:i] + rng.choice(string.ascii_letters + " _,()=") + pred[i:]
            else:
                pred = pred[:i] + rng.choice(string.digits) + pred[i + 1:]
        out.append((pred, gt))
        out.append(("    " + " ".join(["a"] * 150), "    " + " ".join(["a"] * 160) + " b"))
    return out


def fuzz_pairs(rng):
    out = [("", ""), ("a", ""), ("", "a"), ("abc", "abc"), ("abc", "abd"), ("hello", "world"),
           ("é", "e"), ("北京大学", "北京"), ("ab" * 5, "ba" * 5)]
    # ratio 0.5 / 0.25 ties for round-half-even: 100 * ratio = x.5 exactly
    out += [("abcd", "abce" + "x" * 4), ("a" * 1, "ab" * 1 + "c" * 197)]
    for n in (50, 199, 200, 201, 450, 1000):
        a = "".join(rng.choice("aab c\n") for _ in range(n))
        b = "".join(rng.choice("aab cd") for _ in range(n + rng.randint(-5, 5)))
        out.append((a, b))
    return out


def porter_words(multi_news):
    words = set()
    for rec in multi_news:
        words.update(re.findall(r"[a-z0-9]+", rec["answers"][0].lower()))
    extra = ["caresses", "ponies", "ties", "caress", "cats", "feed", "agreed", "plastered", "bled",
             "motoring", "sing", "conflated", "troubled", "sized", "hopping", "tanned", "falling",
             "hissing", "fizzed", "failing", "filing", "happy", "sky", "skies", "dying", "lying",
             "tying", "news", "innings", "outings", "cannings", "howe", "proceed", "exceed",
             "succeed", "relational", "conditional", "rational", "valenci", "hesitanci",
             "digitizer", "conformabli", "radicalli", "differentli", "vileli", "analogousli",
             "vietnamization", "predication", "operator", "feudalism", "decisiveness",
             "hopefulness", "callousness", "formaliti", "sensitiviti", "sensibiliti",
             "triplicate", "formative", "formalize", "electriciti", "electrical", "hopeful",
             "goodness", "revival", "allowance", "inference", "airliner", "gyroscopic",
             "adjustable", "defensible", "irritant", "replacement", "adjustment", "dependent",
             "adoption", "homologou", "communism", "activate", "angulariti", "homologous",
             "effective", "bowdlerize", "probate", "rate", "cease", "controll", "roll", "yyyy",
             "syzygy", "toy", "by", "ivy", "spied", "flies", "tries", "enjoy", "died", "tied",
             "generalizations", "oscillators", "archaeology", "fulli", "carefulli", "analogi",
             "a", "ab", "is", "y", "ye", "yes", "eed", "ied", "ies", "ing", "sing", "bing",
             "2020s", "covid19", "x11", "abcdefghijklmnopqrstuvwxyz"]
    return sorted(words)[:1500] + extra


JIEBA_TEXTS = [
    "我来到北京清华大学", "他来到了网易杭研大厦", "小明硕士毕业于中国科学院计算所，后在日本京都大学深造",
    "工信处女干事每月经过下属科室都要亲口交代24口交换机等技术性器件的安装工作", "结过婚的和尚未结过婚的",
    "", " ", "\r\n", "a\r\nb\rc\n", "iPhone 15 Pro Max售价9999元", "增长了3.5%，达到12.5亿元",
    "C++和C#都是编程语言", "AT&T、IBM与Google", "２０２３年１２月", "①②③", "😀😀北京",
    "中文English混合123测试", "「引号」《书名》【括号】", "一二三四五六七八九十百千万亿",
    "李小福是创新办主任也是云计算方面的专家", "永和服装饰品有限公司", "我们中出了一个叛徒",
    "这是一个伸手不见五指的黑夜。我叫孙悟空，我爱北京，我爱Python和C++。",
    "龘靐齉爩", "\u3000全角空格\u3000", "tab\t分隔", "x.y_z-w%#&+", "3.14.15", "v1.2.3版本",
]


def zh_snippets(mfqa_zh, rng, n, lo, hi):
    out = []
    for rec in mfqa_zh[:n]:
        ctx = rec["context"]
        start = rng.randrange(0, max(1, len(ctx) - hi))
        out.append(ctx[start:start + rng.randint(lo, hi)])
    return out


# ---------------------------------------------------------------------------------------------


def check_environment():
    import fuzzywuzzy.fuzz as fz
    assert fz.SequenceMatcher is difflib.SequenceMatcher, \
        "fuzzywuzzy must use difflib (uninstall python-Levenshtein), as in LongBench's environment"
    assert jieba.__version__ == "0.42.1", jieba.__version__
    dict_path = os.path.join(os.path.dirname(jieba.__file__), "dict.txt")
    with open(dict_path, "rb") as f:
        md5 = hashlib.md5(f.read()).hexdigest()
    assert md5 == DEBIAN_JIEBA_DICT_MD5, f"{dict_path}: md5 {md5}, not Debian python3-jieba's"
    assert sys.getrecursionlimit() == DEFAULT_RECURSION_LIMIT


def pkg_version(name):
    from importlib.metadata import version
    return version(name)


def main():
    ap = argparse.ArgumentParser()
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--shared", default=os.path.join(here, "..", "..", "shared"))
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "fixtures", "eval_metrics",
                                                  "golden.json"))
    args = ap.parse_args()
    check_environment()
    rng = random.Random(20240611)
    lb = os.path.join(args.shared, "data", "longbench")
    multi_news = read_jsonl(os.path.join(lb, "multi_news.jsonl"))
    mfqa_zh = read_jsonl(os.path.join(lb, "multifieldqa_zh.jsonl"))
    pr_zh = read_jsonl(os.path.join(lb, "passage_retrieval_zh.jsonl"))

    cases = []

    def add(metric, prediction, ground_truth, all_classes=None):
        value = metric_value(metric, prediction, ground_truth, all_classes)
        cases.append({"metric": metric, "prediction": prediction, "ground_truth": ground_truth,
                      "all_classes": all_classes, "expected": float(value)})

    # qa_f1_score
    for p, g in qa_pairs(rng, multi_news) + ADVERSARIAL_QA:
        add("qa_f1_score", p, g)
    # qa_f1_zh_score
    for i, rec in enumerate(mfqa_zh[:30]):
        gt = rec["answers"][0]
        other = mfqa_zh[(i + 7) % len(mfqa_zh)]["answers"][0]
        for p in (gt, "根据文章内容，答案是：" + gt, gt.rstrip("。")[: max(1, len(gt) // 2)],
                  other, f"{gt} (English: see text)"):
            add("qa_f1_zh_score", p, gt)
    for p, g in ZH_ADVERSARIAL:
        add("qa_f1_zh_score", p, g)
    # rouge_score
    for i, rec in enumerate(multi_news[:6]):
        gt = rec["answers"][0]
        other = multi_news[(i + 11) % len(multi_news)]["answers"][0]
        for p in summary_variants(rng, gt, other):
            add("rouge_score", p, gt)
    for p, g in [("", "a b."), ("a b.", ""), ("...", "a b."), ("a b.", ". . ."), (" . ", "a b."),
                 ("a b", "a b"), ("A b.", "a B."), ("x. x. x.", "x."), ("a  b\tc\nd", "a b c d"),
                 ("The cat. The dog.", "The dog. The cat."), ("a b c d e f", "f e d c b a"),
                 ("nothing in common", "zzz yyy"), ("\u3000.\u00a0", "a."), ("北京 大学.", "北京 大学")]:
        add("rouge_score", p, g)
    # rouge_score / rouge_zh_score at Python's recursion limit (one sentence, identical words)
    for n in (989, 990, 991):
        s = " ".join(f"w{i}" for i in range(n))
        add("rouge_score", s, s)
        add("rouge_zh_score", s, s)
    s = " ".join(f"w{i}" for i in range(600))
    add("rouge_score", s, " ".join(f"v{i}" for i in range(500)))  # 1 + 500 + 600 - 1 > 991 calls
    add("rouge_score", s, " ".join(f"w{i}" for i in range(0, 600, 2)))
    # rouge_zh_score
    zh_sums = zh_snippets(mfqa_zh, rng, 10, 60, 300)
    for i, gt in enumerate(zh_sums):
        other = zh_sums[(i + 3) % len(zh_sums)]
        for p in (gt, gt[: len(gt) // 2], other, gt[len(gt) // 3:] + other[:30], "总结：" + gt.replace("，", "。")):
            add("rouge_zh_score", p, gt)
    for p, g in ZH_ADVERSARIAL[:12]:
        add("rouge_zh_score", p, g)
    long_zh = zh_snippets(mfqa_zh[40:], rng, 2, 1800, 2200)
    add("rouge_zh_score", long_zh[0], long_zh[0])  # > 990 tokens: RecursionError -> 0.0
    add("rouge_zh_score", long_zh[0][:900], long_zh[0][:1000])
    # classification_score
    trec_preds = ["Description of something", "Description of a person", "Other entity",
                  "The type is: Other number", "Number of something, Other number",
                  "Date", "State", "Other location and City", "Individual\nTitle of a person",
                  "Food Food", "", "Abbreviation or Expression abbreviated", "Sport"]
    for p in trec_preds:
        for g in ("Description of something", "Other number", "Abbreviation", "City", "Food"):
            add("classification_score", p, g, TREC_CLASSES)
    for p in ("体育", "体育产业", "文化、休闲娱乐", "文化", "经济与财经、财政、金融", "", "军事和政治"):
        for g in ("体育", "文化", "财经、财政、金融", "军事"):
            add("classification_score", p, g, LSHT_CLASSES)
    dup = ["Sport", "Sport", "Port", "Spor", "Sport"]
    for p in ("Sport", "Port", "Spor Sport"):
        add("classification_score", p, "Sport", dup)
    # retrieval_score
    for p in ("Paragraph 12", "Paragraph 12 and Paragraph 3", "The answer is Paragraph １２",
              "12", "Paragraph 012", "", "Paragraph ١٢", "Paragraphs 1, 2 and 12.", "None",
              "Paragraph 12\nParagraph 12", "第12段"):
        add("retrieval_score", p, "Paragraph 12")
    add("retrieval_score", "paragraph 7", "Paragraph x Paragraph 7")
    add("retrieval_score", "Paragraph ７", "Paragraph ７")
    # retrieval_zh_score
    for rec in pr_zh[:10]:
        gt = rec["answers"][0]
        num = re.findall(r"\d+", gt)[0]
        wide = "".join(chr(ord(c) + 0xFEE0) for c in num)
        for p in (gt, f"答案是{gt}。", f"段落{wide}", f"段落1和{gt}"):
            add("retrieval_zh_score", p, gt)
    for p in ("", "段落", "段落 3", "没有找到"):
        add("retrieval_zh_score", p, "段落3")
    # count_score
    for p in ("7", "There are 7 unique paragraphs.", "７", "7 or 8", "", "17", "٧", "7, 7, 7",
              "The count is seven", "07", "7.0"):
        add("count_score", p, "7")
    add("count_score", "12 and １２ and ١٢", "12")
    # code_sim_score
    for p, g in CODE_CASES + long_code_pairs(rng):
        add("code_sim_score", p, g)

    # fuzz.ratio on its own
    fuzz_cases = [{"s1": a, "s2": b, "expected": call_as_eval_py(2, fuzz.ratio, a, b)}
                  for a, b in fuzz_pairs(rng)]

    # normalizers on their own
    normalize = [{"text": p, "answer": normalize_answer(p), "zh": normalize_zh_answer(p)}
                 for p, _ in ADVERSARIAL_QA + ZH_ADVERSARIAL]

    # scorer / scorer_e
    def nan_to_none(x):
        return None if isinstance(x, float) and math.isnan(x) else x

    scorers = []

    def add_scorer(dataset, preds, answers, lengths, all_classes):
        entry = {"dataset": dataset, "predictions": preds, "answers": answers, "lengths": lengths,
                 "all_classes": all_classes}
        entry["expected"] = call_as_eval_py(1, scorer, dataset, preds, answers, all_classes)
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # np.mean([]) of an empty bucket
            e = call_as_eval_py(1, scorer_e, dataset, preds, answers, lengths, all_classes)
        entry["expected_e"] = {k: nan_to_none(float(v)) for k, v in e.items()}
        scorers.append(entry)

    recs = multi_news[20:32]
    add_scorer("multi_news",
               [summary_variants(rng, r["answers"][0], recs[(i + 1) % len(recs)]["answers"][0])[i % 6]
                for i, r in enumerate(recs)],
               [r["answers"] for r in recs], [r["length"] * 3 for r in recs], None)
    recs = mfqa_zh[50:80]
    add_scorer("multifieldqa_zh",
               [("答案：" + r["answers"][0]) if i % 3 else mfqa_zh[i]["answers"][0]
                for i, r in enumerate(recs)],
               [r["answers"] for r in recs], [r["length"] for r in recs], None)
    recs = pr_zh[20:80]
    add_scorer("passage_retrieval_zh",
               [r["answers"][0] if i % 4 else f"段落{i}，{r['answers'][0]}" for i, r in enumerate(recs)],
               [r["answers"] for r in recs], [r["length"] for r in recs], None)
    recs = mfqa_zh[100:110]
    add_scorer("vcsum", [r["context"][5:200] for r in recs], [[r["context"][:250]] for r in recs],
               [r["length"] for r in recs], None)
    add_scorer("dureader", [r["answers"][0] + "。" for r in recs],
               [[r["answers"][0], r["context"][:80]] for r in recs], [r["length"] for r in recs], None)
    add_scorer("trec", ["\n\nDescription of something\nOther", "Other number", "\nCity", "Food\n",
                        "Type: Individual", "Date"],
               [["Description of something"], ["Other number"], ["City"], ["Food"],
                ["Individual"], ["Number of something"]], [1000, 5000, 9000, 3999, 4000, 8000],
               TREC_CLASSES)
    add_scorer("lsht", ["体育\n军事", "\n文化", "财经、财政、金融"], [["体育"], ["文化"], ["经济"]],
               [100, 200, 300], LSHT_CLASSES)
    add_scorer("triviaqa", ["\nParis\nQuestion: next", "the Beatles!", "London is the answer"],
               [["Paris", "paris, france"], ["The Beatles"], ["Londres", "London"]],
               [5000, 5000, 5000], None)
    add_scorer("samsum", ["\nTom will bring the cake. Anna agrees.\nDialogue: more", "",
                          "They meet at 5."],
               [["Tom will bring the cake and Anna agrees."], ["Bob is late."], ["They meet at 5 pm."]],
               [100, 9000, 9000], None)
    add_scorer("lcc", [c[0] for c in CODE_CASES], [[c[1]] for c in CODE_CASES],
               [i * 700 for i in range(len(CODE_CASES))], None)
    add_scorer("passage_retrieval_en", ["Paragraph 3", "Paragraph 3, Paragraph 4", "4"],
               [["Paragraph 3"], ["Paragraph 4"], ["Paragraph 4"]], [4000, 4000, 4000], None)
    # Many varied fractions: pairwise summation (numpy) and Python's left-to-right sum.
    for n, spread in ((300, (0, 20000)), (150, (0, 4000)), (9, (0, 4000)), (7, (0, 4000))):
        preds, answers, lengths = [], [], []
        for i in range(n):
            k = rng.randint(1, 9)
            nums = [str(rng.randint(1, 4)) for _ in range(k)]
            preds.append(" ".join(nums))
            answers.append([str(rng.randint(1, 4))])
            lengths.append(rng.randint(*spread))
        add_scorer("passage_count", preds, answers, lengths, None)

    # numpy's mean and round, Python's round
    numerics = {"mean": [], "round": []}
    for n in (1, 7, 8, 9, 15, 16, 17, 127, 128, 129, 255, 256, 257, 1000):
        v = [rng.random() * 10 ** rng.randint(-3, 3) for _ in range(n)]
        numerics["mean"].append({"values": v, "expected": float(np.mean(v))})
    # large lists are regenerated in C++ from a simple LCG to keep the file small
    for n in (8191, 8192, 8193, 20000, 100000):
        v = lcg_values(n)
        numerics["mean"].append({"lcg_n": n, "expected": float(np.mean(v))})
    for x in [69.465, 41.925000000000004, 60.635, 3.735, 1.005, 0.125, 2.675, 100.0, 0.0,
              33.333333333333336, 66.66666666666667, 12.345] + [rng.random() * 100 for _ in range(200)]:
        numerics["round"].append({"x": x, "python": round(x, 2),
                                  "numpy": float(round(np.float64(x), 2))})

    # jieba
    jieba_cases = [{"text": t, "tokens": list(jieba.cut(t, cut_all=False))}
                   for t in JIEBA_TEXTS + zh_snippets(mfqa_zh[120:], rng, 12, 50, 400)
                   + [r["input"] for r in pr_zh[:5]]]

    # Google rouge-score
    scorers_g = {s: rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=s)
                 for s in (False, True)}
    google = []
    pairs = []
    for i, rec in enumerate(multi_news[40:52]):
        gt = rec["answers"][0]
        other = multi_news[40 + (i + 1) % 12]["answers"][0]
        pairs += [(gt, p) for p in summary_variants(rng, gt, other)[:5]]
    pairs += [("", ""), ("", "a"), ("a", ""), ("!!!", "???"), ("The cats are running.", "the cat ran"),
              ("İstanbul KELVIN", "istanbul kelvin"), ("Caresses ponies generalizations", "caress poni generalization"),
              ("北京 2020 COVID-19", "covid 19 in 2020"), ("a a a b", "a b b"), ("x", "x")]
    for target, prediction in pairs:
        for s, sc in scorers_g.items():
            r = sc.score(target, prediction)
            google.append({"target": target, "prediction": prediction, "use_stemmer": s,
                           "rouge1": r["rouge1"].fmeasure, "rouge2": r["rouge2"].fmeasure,
                           "rougeL": r["rougeL"].fmeasure})
    stemmer = porter.PorterStemmer()
    porter_cases = [[w, stemmer.stem(w)] for w in porter_words(multi_news)]

    out = {
        "about": "Made by data_scripts/make_eval_metrics_golden.py; expected values of the Python "
                 "originals (LongBench metrics.py/eval.py @ 2e00731f, rouge, fuzzywuzzy, jieba, "
                 "rouge-score, numpy) for lib/kvlab/eval/metrics.",
        "versions": {"python": sys.version.split()[0], "rouge": pkg_version("rouge"),
                     "rouge-score": pkg_version("rouge-score"), "nltk": nltk.__version__,
                     "fuzzywuzzy": pkg_version("fuzzywuzzy"), "jieba": jieba.__version__,
                     "numpy": np.__version__, "jieba_dict_md5": DEBIAN_JIEBA_DICT_MD5},
        "metrics": cases,
        "fuzz_ratio": fuzz_cases,
        "normalize": normalize,
        "scorers": scorers,
        "numerics": numerics,
        "jieba": jieba_cases,
        "google_rouge": google,
        "porter": porter_cases,
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=0, allow_nan=False)
        f.write("\n")
    n = (len(cases) + len(fuzz_cases) + len(normalize) + len(scorers) + len(numerics["mean"])
         + len(numerics["round"]) + len(jieba_cases) + len(google) + len(porter_cases))
    print(f"wrote {args.out}: {n} cases ({len(cases)} metric calls, {len(scorers)} scorer sets, "
          f"{len(jieba_cases)} jieba texts, {len(google)} rouge-score, {len(porter_cases)} porter), "
          f"{os.path.getsize(args.out)} bytes")


def lcg_values(n):
    """Deterministic doubles in [0, 1) that C++ regenerates (test_eval_metrics.cpp lcg_values)."""
    state, out = 12345, []
    for _ in range(n):
        state = (state * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        out.append((state >> 11) / float(1 << 53))
    return out


if __name__ == "__main__":
    sys.exit(main())
