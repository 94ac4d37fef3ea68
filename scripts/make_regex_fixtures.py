#!/usr/bin/env python3
"""Writes tests/data/regex/fullmatch.json: patterns, texts and whether Python's
re.fullmatch(pattern, text, re.ASCII) takes each text whole. Python's re is the independent
reference for runtime/regex_dfa.cpp (tests/regex_dfa_test.cpp): vLLM's guided_regex is a Python
pattern, and RegexDfa promises the same whole matches.

Usage (the standard library only):
    python3 scripts/make_regex_fixtures.py [tests/data/regex/fullmatch.json]

Each pattern comes with hand-written texts it should take; the cases are those texts, texts
made from them by deleting, inserting, replacing, doubling and cutting characters, and random
texts over the pattern's characters and a few others, each with re's answer. `python_refuses`
are patterns re.compile rejects (RegexDfa must refuse them too); `refused` are patterns re takes
but a finite automaton cannot follow or RegexDfa bounds, each with a word of the expected error.
"""
import json
import random
import re
import sys
from pathlib import Path

PATTERNS = [
    ("a", ["a"]),
    ("abc", ["abc"]),
    ("a|b|", ["a", "b", ""]),
    ("a*", ["", "aaa"]),
    ("a+b?", ["a", "aab"]),
    ("(ab)*c", ["c", "ababc"]),
    ("(?:ab|cd){2,3}", ["abcd", "cdcdab"]),
    ("x{3}", ["xxx"]),
    ("x{2,}", ["xx", "xxxxx"]),
    ("x{,2}", ["", "x", "xx"]),
    ("x{,}", ["", "xxx"]),
    ("x{1,3}?y", ["xy", "xxxy"]),
    ("a{", ["a{"]),
    ("a{1", ["a{1"]),
    ("a{x}", ["a{x}"]),
    ("a{1,2,3}", ["a{1,2,3}"]),
    ("{a}", ["{a}"]),
    ("\\d{3}-\\d{4}", ["555-1234"]),
    ("[A-Z][a-z]+", ["Hello"]),
    ("[^abc]+", ["xyz", "é€"]),
    ("[]a]+", ["]a]"]),
    ("[^]a]", ["b"]),
    ("[a-]+", ["a-"]),
    ("[-a]+", ["-a"]),
    ("[\\d\\s]+", ["1 2\t3"]),
    ("[\\w.-]+@[\\w-]+\\.[a-z]{2,}", ["john.doe@example.com"]),
    ("\\w+", ["abc_123"]),
    ("\\W+", ["!?", "é"]),
    ("\\S+\\s\\S+", ["ab cd"]),
    ("\\D*", ["abc"]),
    (".+", ["anything here", "é€😀"]),
    ("a.c", ["abc", "aéc"]),
    ("\\.\\*\\+\\?\\(\\)\\[\\]\\{\\}\\|\\\\\\^\\$", [".*+?()[]{}|\\^$"]),
    ("\\x41\\u00e9\\U0001F600", ["Aé😀"]),
    ("\\t\\n\\r\\f\\v\\a\\0", ["\t\n\r\f\v\a\0"]),
    ("\\012\\0", ["\n\0"]),
    ("^abc$", ["abc"]),
    ("\\Aab\\Z", ["ab"]),
    ("^a|b$", ["a", "b"]),
    ("(?P<year>\\d{4})-(?P<month>\\d{2})", ["2024-01"]),
    ("(?#comment)ab", ["ab"]),
    ("é+", ["ééé"]),
    ("[α-ω]+", ["αβγ"]),
    ("[\\u0100-\\U0001F600]", ["Ā", "😀"]),
    ("[^\\x00-\\x7f]+", ["é😀"]),
    ("(true|false)", ["true", "false"]),
    ("-?(0|[1-9]\\d*)(\\.\\d+)?([eE][+-]?\\d+)?", ["0", "-12.5e+3"]),
    ("(a|ab)(c|bcd)(d*)", ["abcd"]),
    ("((a)*)*", ["", "aaa"]),
    ("(a*)+b", ["b", "aab"]),
    ("[ \\t]*(yes|no)[ \\t]*", [" yes ", "no"]),
    ("\\d{4}-\\d{2}-\\d{2}T\\d{2}:\\d{2}:\\d{2}Z", ["2024-01-31T12:00:00Z"]),
    ("[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
     ["123e4567-e89b-12d3-a456-426614174000"]),
    ("(\\w+ ){2,4}\\w+\\.", ["the quick brown fox."]),
    ("x*?", ["", "xx"]),
    ("(?:a|b)??c", ["c", "ac"]),
    ("[\\b]", ["\b"]),
    ("a]b}", ["a]b}"]),
    ("[^\\n]*", ["abc"]),
    ("\\-\\ \\#\\&\\~\\é", ["- #&~é"]),
    ("", [""]),
    ("()", [""]),
    ("a{0}", [""]),
    ("a{2,2}", ["aa"]),
    ("[a-c][^a-c]", ["az"]),
    ("(cat|category|cater)s?", ["cats", "category", "cater"]),
    ("[\\s\\S]{0,5}", ["", "a\nb"]),
    ("[\\D\\d]x", ["ax", "1x"]),
]

# re.compile rejects these.
PYTHON_REFUSES = ["(", ")", "[a", "a**", "*a", "+", "a{3,2}", "[b-a]", "\\", "\\q", "(?P<>a)",
                  "a|*", "[\\d-z]", "(?P<n", "\\x4", "\\u12"]

# re takes these; RegexDfa refuses them (a word of the expected error each).
REFUSED = [
    ("(a)\\1", "backreference"), ("(?P<x>a)(?P=x)", "backreference"), ("(?=a)a", "lookahead"),
    ("(?!b)a", "lookahead"), ("(?<=a)b", "lookbehind"), ("(?<!a)b", "lookbehind"),
    ("(?>a)", "atomic"), ("a*+", "possessive"), ("a{1,2}+", "possessive"), ("(?i)a", "flags"),
    ("\\bword\\b", "word boundaries"), ("a^b", "anchor"), ("a$b", "anchor"), ("(^a)", "anchor"),
    ("(a$)", "anchor"), ("a{1001}", "bound"), ("[^\\s\\S]", "no text"), ("(a)(?(1)b|c)", "conditional"),
    ("\\N{LATIN SMALL LETTER A}", "escape"),
]

EXTRA = ["a", "b", "1", " ", "-", ".", "é", "\n", "_", "@", "Z", "]", "x", "😀"]


def cases(pattern, seeds, rng):
    compiled = re.compile(pattern, re.ASCII)
    alphabet = sorted(set("".join(seeds)) | set(EXTRA))
    texts = set(seeds)
    for s in seeds:
        for i in range(len(s) + 1):
            texts.add(s[:i])  # every prefix
        for _ in range(12):
            t = list(s)
            op = rng.randrange(4)
            i = rng.randrange(len(t) + 1)
            if op == 0 and t:
                del t[min(i, len(t) - 1)]
            elif op == 1:
                t.insert(i, rng.choice(alphabet))
            elif op == 2 and t:
                t[min(i, len(t) - 1)] = rng.choice(alphabet)
            else:
                t = t + t
            texts.add("".join(t))
    for _ in range(24):
        texts.add("".join(rng.choice(alphabet) for _ in range(rng.randrange(9))))
    return [[t, compiled.fullmatch(t) is not None] for t in sorted(texts)]


def main():
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "tests/data/regex/fullmatch.json")
    rng = random.Random(20261207)
    for p in PYTHON_REFUSES:
        try:
            re.compile(p, re.ASCII)
        except re.error:
            continue
        raise SystemExit(f"re.compile took {p!r}, which is listed as refused by Python")
    for p, _ in REFUSED:
        re.compile(p, re.ASCII)  # Python takes each (else the list is wrong)
    data = {
        "generator": f"scripts/make_regex_fixtures.py, Python {sys.version.split()[0]} re, "
                     "re.fullmatch(pattern, text, re.ASCII)",
        "patterns": [{"pattern": p, "cases": cases(p, seeds, rng)} for p, seeds in PATTERNS],
        "python_refuses": PYTHON_REFUSES,
        "refused": [{"pattern": p, "error": e} for p, e in REFUSED],
    }
    for entry, (_, seeds) in zip(data["patterns"], PATTERNS):
        for s in seeds:
            assert [s, True] in entry["cases"], (entry["pattern"], s)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    total = sum(len(e["cases"]) for e in data["patterns"])
    print(f"{out}: {len(PATTERNS)} patterns, {total} cases")


if __name__ == "__main__":
    main()
