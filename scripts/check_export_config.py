#!/usr/bin/env python3
"""Check that transformers accepts the quantization_config of a `qforge export` directory.

Usage: python scripts/check_export_config.py DIR [DIR ...]

For each DIR, reads DIR/config.json, builds transformers' GPTQConfig or AwqConfig from its
quantization_config with from_dict (which runs the class's own validation, post_init), and
checks that the fields loaders read came through unchanged: quant_method, bits, group_size and,
for GPTQ, sym, desc_act and checkpoint_format; for AWQ, zero_point, version and
modules_to_not_convert. Also checks that transformers' AutoConfig reads config.json and, when
the export has tokenizer.json, that AutoTokenizer loads it (BOS/EOS as tokenizer_config.json
names them). Exits 1 on the first mismatch. Needs `transformers` (no weights are loaded, no GPU).
"""
import json
import sys
from pathlib import Path


def check(directory: Path) -> None:
    import transformers
    from transformers import AutoConfig, AwqConfig, GPTQConfig

    config = json.loads((directory / "config.json").read_text())
    qc = config["quantization_config"]
    method = qc["quant_method"]
    cls = {"gptq": GPTQConfig, "awq": AwqConfig}[method]
    parsed = cls.from_dict(dict(qc))
    back = parsed.to_dict()
    keys = ["quant_method", "bits", "group_size"]
    keys += ["sym", "desc_act", "checkpoint_format"] if method == "gptq" else [
        "zero_point", "version", "modules_to_not_convert"]
    for key in keys:
        got = back.get(key)
        if hasattr(got, "value"):  # enums (quant_method, version)
            got = got.value
        want = qc.get(key)
        if str(got).lower() != str(want).lower():
            sys.exit(f"{directory}: {cls.__name__}.{key} is {got!r}, config.json says {want!r}")
    hf = AutoConfig.from_pretrained(directory)
    assert hf.model_type == config["model_type"], (hf.model_type, config["model_type"])
    tokenizer = ""
    if (directory / "tokenizer.json").exists():
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(directory)
        tc = json.loads((directory / "tokenizer_config.json").read_text())
        for key in ("bos_token", "eos_token"):
            if getattr(tok, key) != tc.get(key):
                sys.exit(f"{directory}: AutoTokenizer {key} is {getattr(tok, key)!r}, "
                         f"tokenizer_config.json says {tc.get(key)!r}")
        tokenizer = (f"; AutoTokenizer: {len(tok)} tokens, bos {tok.bos_token!r}, "
                     f"eos {tok.eos_token!r}, 'Hello world' -> {tok('Hello world')['input_ids']}")
    print(f"{directory}: transformers {transformers.__version__} {cls.__name__} accepts it: "
          + ", ".join(f"{k}={back.get(k)!r}" for k in keys)
          + f"; AutoConfig: {type(hf).__name__}" + tokenizer)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    failed = False
    for arg in sys.argv[1:]:
        try:
            check(Path(arg))
        except Exception as e:  # one line per rejected export, then the next one
            print(f"{arg}: REJECTED: {type(e).__name__}: {e}")
            failed = True
    sys.exit(1 if failed else 0)
