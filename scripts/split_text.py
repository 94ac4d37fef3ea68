#!/usr/bin/env python3
"""Split a text file at the blank line nearest a fraction of its bytes (calibration/evaluation).

    scripts/split_text.py FILE FRACTION [--out-a A.txt --out-b B.txt]

Prints the byte offsets: the split point (the start of the line after the blank line nearest
FRACTION * size) and the size, as `split_offset=N size=M`. With --out-a/--out-b it also writes the
two parts: bytes [0, N) and [N, size). No blank line at all: the nearest line break is used; a
file without line breaks is refused. Calibrate on one part and evaluate on the other so the
perplexity is not measured on the calibration text.
"""
import argparse
import os
import sys


def split_offset(data: bytes, fraction: float) -> int:
    target = int(len(data) * fraction)
    best = None
    for sep in (b"\n\n", b"\n"):
        # The nearest occurrence at or after the target, and the nearest before it.
        after = data.find(sep, target)
        before = data.rfind(sep, 0, target)
        candidates = [p + len(sep) for p in (before, after) if p != -1]
        if candidates:
            best = min(candidates, key=lambda p: abs(p - target))
            break
    if best is None:
        raise ValueError("no line break to split at")
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file")
    ap.add_argument("fraction", type=float)
    ap.add_argument("--out-a")
    ap.add_argument("--out-b")
    a = ap.parse_args()
    if not 0.0 < a.fraction < 1.0:
        print(f"split_text: {a.file}: the fraction must be in (0, 1), got {a.fraction}", file=sys.stderr)
        return 2
    try:
        with open(a.file, "rb") as f:
            data = f.read()
        n = split_offset(data, a.fraction)
    except (OSError, ValueError) as e:
        print(f"split_text: {a.file}: {e}", file=sys.stderr)
        return 1
    print(f"split_offset={n} size={len(data)}")
    for path, part in ((a.out_a, data[:n]), (a.out_b, data[n:])):
        if path:
            tmp = path + ".tmp"
            with open(tmp, "wb") as f:
                f.write(part)
            os.replace(tmp, path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
