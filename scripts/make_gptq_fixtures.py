#!/usr/bin/env python3
"""Writes tests/data/gptq/: small GPTQ problems and their answers from an independent numpy
implementation, for tests/quant_gptq_test.cpp.

The implementation follows the published algorithm (Frantar et al., arXiv 2210.17323, Algorithm 1;
IST-DASLab/gptq gptq.py) in its plainest form: no lazy batches (after each column every later
column is updated at once), H^-1 from numpy's Cholesky and a generic inverse. The grid is
qforge's (formats/qtype.cpp), re-derived here from its documentation:
  - scales are computed in float32 and rounded UP to fp16;
  - asymmetric (q4_g*): range [min(0, lo), max(0, hi)] in 15 steps, zero = rint(-lo / scale)
    clamped to [0, 15];
  - symmetric q8*: scale = amax / 127, codes in [-127, 127], zero 0;
  - symmetric q4s*: scale = m / -8 for m the element of largest magnitude (the first on ties),
    codes in [0, 15], zero 8;
  - code = clamp(rint(w / scale) + zero) in float32, rint rounding half to even;
  - weights are cast to float32 before their grid and code are chosen;
  - act-order uses static groups (grids from the original W, dead columns zeroed); types with one
    grid per row compute it once from that W; otherwise a group's grid is computed when the loop
    reaches its first column, on the updated weights.

Usage: python3 scripts/make_gptq_fixtures.py [--out tests/data/gptq]   (needs numpy)
"""
import argparse
import json
import pathlib

import numpy as np

F32 = np.float32

# name: (bits, group (0 = one per row), symmetric)
QTYPES = {
    "q8": (8, 0, True),
    "q8_g32": (8, 32, True),
    "q4_g32": (4, 32, False),
    "q4_g128": (4, 128, False),
    "q4s_g32": (4, 32, True),
    "q4s_g64": (4, 64, True),
}


def f16_round_up(v):
    """The smallest binary16 >= v (v a positive float32), as its 16-bit pattern."""
    h = np.float16(v)
    if F32(h) < v:
        h = np.nextafter(h, np.float16(np.inf))
    if not np.isfinite(h):
        raise ValueError("scale overflows fp16")
    return int(np.array(h).view(np.uint16))


def bits_to_f32(b):
    return F32(np.array(b, dtype=np.uint16).view(np.float16))


def group_params(qtype, w):
    """(scale_bits, scale, zero) of a group of float32 weights."""
    bits, _, sym = QTYPES[qtype]
    w = w.astype(F32)
    if sym:
        zero = 0 if bits == 8 else 8
        m = w[int(np.argmax(np.abs(w)))]  # argmax: the first of equal magnitudes
        if m == 0:
            return 0, F32(0), zero
        s = F32(abs(m)) / F32(127 if bits == 8 else 8)
        sb = f16_round_up(s)
        if bits == 4 and m > 0:
            sb |= 0x8000
        return sb, bits_to_f32(sb), zero
    lo = min(F32(0), w.min())
    hi = max(F32(0), w.max())
    if not hi > lo:
        return 0, F32(0), 0
    sb = f16_round_up(F32(hi - lo) / F32(15))
    scale = bits_to_f32(sb)
    zero = int(np.clip(np.rint(F32(-lo) / scale), 0, 15))
    return sb, scale, zero


def quantize(qtype, p, x):
    bits = QTYPES[qtype][0]
    _, scale, zero = p
    if scale == 0:
        return zero
    lo, hi = (-127, 127) if bits == 8 else (0, 15)
    r = np.rint(F32(x) / scale) + F32(zero)
    return int(np.clip(r, lo, hi))


def dequantize(p, code):
    return F32(p[1] * F32(code - p[2]))


def rtn(qtype, w):
    """Dequantized RTN weights of w [rows][k] (grids from the weights themselves)."""
    group = QTYPES[qtype][1] or w.shape[1]
    out = np.zeros(w.shape, dtype=F32)
    for r in range(w.shape[0]):
        for b in range(0, w.shape[1], group):
            p = group_params(qtype, w[r, b:b + group])
            for c in range(b, min(b + group, w.shape[1])):
                out[r, c] = dequantize(p, quantize(qtype, p, w[r, c]))
    return out


def gptq(qtype, w32, h0, act_order, damp):
    rows, k = w32.shape
    group = QTYPES[qtype][1] or k
    groups = (k + group - 1) // group
    w = w32.astype(np.float64)
    h = h0.copy()
    dead = np.diag(h) == 0
    h[dead, dead] = 1.0
    w[:, dead] = 0.0
    perm = np.argsort(-np.diag(h), kind="stable") if act_order else np.arange(k)
    dynamic = not act_order and QTYPES[qtype][1] != 0
    params = [[None] * groups for _ in range(rows)]
    if not dynamic:
        for r in range(rows):
            for g in range(groups):
                params[r][g] = group_params(qtype, w[r, g * group:(g + 1) * group])
    w = w[:, perm]
    h = h[perm][:, perm]
    h[np.diag_indices(k)] += damp * np.mean(np.diag(h))
    l_inv = np.linalg.inv(np.linalg.cholesky(h))
    u = np.linalg.cholesky(l_inv.T @ l_inv).T  # H^-1 = U^T U, U upper
    codes = np.zeros((rows, k), dtype=np.int32)
    deq = np.zeros((rows, k), dtype=F32)
    loss = 0.0
    for i in range(k):
        if dynamic and i % group == 0:
            for r in range(rows):
                params[r][i // group] = group_params(qtype, w[r, i:i + group])
        oc = perm[i]
        err = np.zeros(rows)
        for r in range(rows):
            p = params[r][oc // group]
            x = w[r, i]
            code = quantize(qtype, p, x)
            q = dequantize(p, code)
            codes[r, oc] = code
            deq[r, oc] = q
            err[r] = (x - float(q)) / u[i, i]
            loss += err[r] ** 2 / 2
        w[:, i + 1:] -= np.outer(err, u[i, i + 1:])
    return codes, params, deq, loss


def output_error(h, e):
    e = e.astype(np.float64)
    return float(np.einsum("ri,ij,rj->", e, h, e))


def correlated_inputs(rng, n, k, latent, dead):
    """Activations with shared latent factors, uneven channel scales and a few outlier channels."""
    z = rng.standard_normal((n, latent)) @ rng.standard_normal((latent, k)) / np.sqrt(latent)
    x = z + 0.3 * rng.standard_normal((n, k))
    x *= np.exp(0.5 * rng.standard_normal(k))
    x[:, rng.choice(k, 3, replace=False)] *= 6.0
    x[:, dead] = 0.0
    return x.astype(F32)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(pathlib.Path(__file__).resolve().parent.parent /
                                         "tests" / "data" / "gptq"))
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(20240611)

    sets = {}
    # name: (rows, k, tokens, latent factors, dead input columns)
    for name, (rows, k, n, latent, dead) in {"a": (24, 100, 300, 12, [37]),
                                             "b": (16, 64, 200, 8, [5])}.items():
        x = correlated_inputs(rng, n, k, latent, dead)
        xd = x.astype(np.float64)
        h = 2.0 / n * (xd.T @ xd)
        w = (0.02 * rng.standard_normal((rows, k))).astype(F32)
        w[rng.random((rows, k)) < 0.02] *= 8.0  # outlier weights stretch some groups
        (out / f"set_{name}.w.f32").write_bytes(w.astype("<f4").tobytes())
        (out / f"set_{name}.h.f64").write_bytes(h.astype("<f8").tobytes())
        sets[name] = (w, h, rows, k)

    cases = []
    damp = 0.01
    for name, set_name, qtype, act_order in [
        ("a_q4_g32", "a", "q4_g32", False),
        ("a_q4s_g32", "a", "q4s_g32", False),
        ("a_q4_g128", "a", "q4_g128", False),
        ("a_q8_act", "a", "q8", True),
        ("b_q4_g32_act", "b", "q4_g32", True),
        ("b_q8_g32", "b", "q8_g32", False),
        ("b_q4s_g64_act", "b", "q4s_g64", True),
    ]:
        w, h, rows, k = sets[set_name]
        codes, params, deq, loss = gptq(qtype, w, h, act_order, damp)
        err = output_error(h, w.astype(np.float64) - deq)
        rtn_err = output_error(h, w.astype(np.float64) - rtn(qtype, w))
        print(f"{name}: GPTQ output error {err:.6g}, RTN {rtn_err:.6g} ({err / rtn_err:.3f}x)")
        cases.append({
            "name": name, "set": set_name, "qtype": qtype, "act_order": act_order,
            "damp": damp, "rows": rows, "k": k,
            "codes": codes.tolist(),
            "scale_bits": [[p[0] for p in row] for row in params],
            "zeros": [[p[2] for p in row] for row in params],
            "loss": loss, "output_error": err, "rtn_output_error": rtn_err,
        })
    doc = {
        "generator": "scripts/make_gptq_fixtures.py",
        "numpy": np.__version__,
        "files": "set_<s>.w.f32: W [rows][k] float32 LE; set_<s>.h.f64: H [k][k] float64 LE",
        "cases": cases,
    }
    (out / "cases.json").write_text(json.dumps(doc, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()
