#!/usr/bin/env python3
"""End-to-end test of `qforge serve` with the official PyPI `openai` client.

Usage: openai_client_test.py QFORGE_BINARY MODEL.qf

Starts the server on a free loopback port, then through openai.OpenAI(base_url=...): a
completion (greedy, compared with `qforge generate --raw --greedy` on the same prompt), the same
completion streamed (the chunks must add up to the same text), one with presence and frequency
penalties and one with logit biases (each against generate's with the same options), logprobs
(whole and streamed) and a prompt's (echo), several prompts in one request (whole and streamed,
each choice the request of its prompt alone), a seeded sampled completion twice (identical),
/v1/models (listed and retrieved), a chat request (stories260K has no chat template: a 400 the
client raises as BadRequestError), bad requests the client raises as errors, an API key the
client must send, and chat through a template given to the server (`--chat-template`, under
`--served-model-name`: whole, streamed and with logprobs) against `qforge generate
--chat-template`, and a structured (JSON schema) chat with the schema pydantic writes for a class,
against `qforge generate --json-schema`. Exits 0 when every check passes, 1 with the failures
listed otherwise.
"""
import os
import subprocess
import sys
import tempfile

import datetime
import json
import re

import openai
import pydantic

from e2e_support import Checks, start


def main():
    qforge, model = sys.argv[1], sys.argv[2]
    check = Checks()

    prompt = "Once upon a time"

    def generated(*options):
        gen = subprocess.run([qforge, "generate", model, "--raw", "--greedy", "-q", "-p", prompt,
                              "-t", "2", *options], capture_output=True, text=True, check=True)
        # generate prints the prompt, then the continuation, then a newline.
        return gen.stdout[len(prompt):-1]

    want = generated("-n", "24")
    penalized = generated("-n", "64", "--presence-penalty", "1.5", "--frequency-penalty", "-0.5")
    # stories260K's margins are wide: +20 on token 100 ("a") changes the text after 19 tokens.
    biased = generated("-n", "24", "--logit-bias", "100=20", "--logit-bias", "7=-100")
    repeated = generated("-n", "24", "--repeat-penalty", "3", "--repeat-last-n", "-1")

    proc, port = start(qforge, model)
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused",
                               max_retries=0, timeout=60)
        r = client.completions.create(model="stories", prompt=prompt, max_tokens=24,
                                      temperature=0)
        check(r.choices[0].text == want, f"completion {r.choices[0].text!r} != generate {want!r}")
        check(r.usage.completion_tokens > 0, "usage.completion_tokens")

        text = "".join(c.choices[0].text for c in client.completions.create(
            model="stories", prompt=prompt, max_tokens=24, temperature=0, stream=True)
            if c.choices)
        check(text == want, f"streamed {text!r} != {want!r}")

        r = client.completions.create(model="stories", prompt=prompt, max_tokens=64,
                                      temperature=0, presence_penalty=1.5, frequency_penalty=-0.5)
        check(r.choices[0].text == penalized,
              f"penalized {r.choices[0].text!r} != generate {penalized!r}")

        r = client.completions.create(model="stories", prompt=prompt, max_tokens=24,
                                      temperature=0, logit_bias={"100": 20, "7": -100})
        check(r.choices[0].text == biased and biased != want,
              f"biased {r.choices[0].text!r} != generate {biased!r} (or the bias changed nothing)")

        # vLLM's repetition_penalty, as its users send it: through the client's extra_body.
        r = client.completions.create(model="stories", prompt=prompt, max_tokens=24,
                                      temperature=0, extra_body={"repetition_penalty": 3})
        check(r.choices[0].text == repeated and repeated != want,
              f"repetition penalty {r.choices[0].text!r} != generate {repeated!r} (or no change)")

        # logprobs as the client reads them: one per token, the tokens' text the completion's,
        # the chosen token among its alternatives; streamed, the chunks' tokens join the same.
        r = client.completions.create(model="stories", prompt=prompt, max_tokens=24,
                                      temperature=0, logprobs=2)
        lp = r.choices[0].logprobs
        check(r.choices[0].text == want and "".join(lp.tokens) == want,
              f"logprobs' tokens {lp.tokens!r} do not make {want!r}")
        check(len(lp.token_logprobs) == r.usage.completion_tokens
              and all(x <= 0 for x in lp.token_logprobs), "one logprob (<= 0) per token")
        check(all(top[t] == v == max(top.values())
                  for t, v, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs)),
              "greedy: each token the most likely among its alternatives")
        parts = [c.choices[0].logprobs for c in client.completions.create(
            model="stories", prompt=prompt, max_tokens=24, temperature=0, logprobs=2,
            stream=True) if c.choices and c.choices[0].logprobs]
        check([t for p in parts for t in p.tokens] == lp.tokens
              and [x for p in parts for x in p.token_logprobs] == lp.token_logprobs,
              "streamed logprobs equal the whole response's")

        # A prompt's log-likelihood as evaluation harnesses ask for it (lm-eval's completions
        # model: echo, logprobs, no new tokens): the prompt back, its first token unscored.
        r = client.completions.create(model="stories", prompt=prompt, max_tokens=0, echo=True,
                                      logprobs=1, temperature=0)
        lp = r.choices[0].logprobs
        check(r.choices[0].text == prompt and "".join(lp.tokens) == prompt,
              f"echo {r.choices[0].text!r} / {lp.tokens!r} is not the prompt {prompt!r}")
        check(lp.token_logprobs[0] is None and all(x <= 0 for x in lp.token_logprobs[1:])
              and len(lp.tokens) == r.usage.prompt_tokens and r.usage.completion_tokens == 0,
              f"echo's logprobs: {lp.token_logprobs!r}, usage {r.usage!r}")

        # Several prompts in one request (lm-eval batches its requests so): one choice per
        # prompt in order, each the request of that prompt alone; usage sums them.
        prompts = [prompt, "The little dog", "Tom and"]
        r = client.completions.create(model="stories", prompt=prompts, max_tokens=24,
                                      temperature=0)
        alone = [client.completions.create(model="stories", prompt=p, max_tokens=24,
                                           temperature=0) for p in prompts]
        check([c.index for c in r.choices] == [0, 1, 2]
              and [c.text for c in r.choices] == [a.choices[0].text for a in alone]
              and r.choices[0].text == want,
              f"batched prompts {[c.text for c in r.choices]!r} != one at a time")
        check(r.usage.completion_tokens == sum(a.usage.completion_tokens for a in alone)
              and r.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone),
              f"batched usage {r.usage!r}")
        texts = ["", "", ""]
        for c in client.completions.create(model="stories", prompt=prompts, max_tokens=24,
                                           temperature=0, stream=True):
            for choice in c.choices:
                texts[choice.index] += choice.text
        check(texts == [c.text for c in r.choices], f"batched, streamed: {texts!r}")

        kw = dict(model="stories", prompt=prompt, max_tokens=16, temperature=0.9, seed=7,
                  top_p=0.9)
        a = client.completions.create(**kw).choices[0].text
        b = client.completions.create(**kw).choices[0].text
        check(a == b, f"seeded sampling differs: {a!r} vs {b!r}")

        models = client.models.list()
        check(len(models.data) == 1, "one model listed")
        check(client.models.retrieve(models.data[0].id).id == models.data[0].id,
              "the listed model retrieved by its id")
        try:
            client.models.retrieve("no-such-model")
            check(False, "retrieving an unknown model must fail")
        except openai.NotFoundError:
            pass

        try:
            client.chat.completions.create(model="stories",
                                           messages=[{"role": "user", "content": "hi"}])
            check(False, "chat without a template should be refused")
        except openai.BadRequestError as e:
            check("chat template" in str(e), f"chat refusal names the template: {e}")
        for bad, what in ((dict(n=2), "n"), (dict(max_tokens=100000), "max_tokens"),
                          (dict(temperature=5), "temperature")):
            try:
                client.completions.create(model="stories", prompt=prompt, **bad)
                check(False, f"{what} out of range should be refused")
            except openai.BadRequestError:
                pass
    finally:
        proc.terminate()
        out = proc.communicate(timeout=30)[0]
    check(proc.returncode == 0, f"server exit code {proc.returncode}: {out[-2000:]}")
    check("cmpl-" in out, "request ids in the server log")

    proc, port = start(qforge, model, "--api-key", "s3cret")
    try:
        bad = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="wrong",
                            max_retries=0)
        try:
            bad.completions.create(model="stories", prompt=prompt, max_tokens=2)
            check(False, "a wrong API key should be refused")
        except openai.AuthenticationError:
            pass
        good = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="s3cret",
                             max_retries=0)
        r = good.completions.create(model="stories", prompt=prompt, max_tokens=2)
        check(len(r.choices) == 1, "the right API key is accepted")
    finally:
        proc.terminate()
        proc.communicate(timeout=30)

    # A chat template given to the server (stories260K's files carry none): chat through the
    # client, whole and streamed, is `qforge generate --chat-template` of the same message, and
    # its logprobs (chat's shape) spell the reply.
    with tempfile.TemporaryDirectory() as tmp:
        template = os.path.join(tmp, "chat.jinja")
        with open(template, "w") as f:
            f.write("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
                    "{% if add_generation_prompt %}[assistant] {% endif %}")
        reply = subprocess.run([qforge, "generate", model, "--chat-template", template, "-q",
                                "--greedy", "-n", "12", "-t", "2", "-p", "Tell a story."],
                               capture_output=True, text=True, check=True).stdout[:-1]
        # Structured output: the JSON schema pydantic writes for a model class, as the client
        # sends it in strict mode (additionalProperties false, titles), constrained the same
        # way by `generate --json-schema`.
        class Person(pydantic.BaseModel):
            name: str
            age: int = pydantic.Field(ge=0, le=150)  # minimum, maximum
            born: datetime.date  # format date

        schema = openai.lib._pydantic.to_strict_json_schema(Person)
        structured = subprocess.run([qforge, "generate", model, "--chat-template", template, "-q",
                                     "--greedy", "-n", "40", "-t", "2", "-p", "Who is Tom?",
                                     "--json-schema", json.dumps(schema)],
                                    capture_output=True, text=True, check=True).stdout[:-1]
        proc, port = start(qforge, model, "--chat-template", template, "--served-model-name",
                           "org/stories-chat")
        try:
            client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused",
                                   max_retries=0, timeout=60)
            kw = dict(model="org/stories-chat",
                      messages=[{"role": "user", "content": "Tell a story."}],
                      max_tokens=12, temperature=0)
            check([m.id for m in client.models.list().data] == ["org/stories-chat"]
                  and client.models.retrieve("org/stories-chat").id == "org/stories-chat",
                  "--served-model-name is the listed and retrieved id")
            r = client.chat.completions.create(logprobs=True, top_logprobs=2, **kw)
            check(r.model == "org/stories-chat", f"the response's model {r.model!r}")
            text = r.choices[0].message.content
            check(text == reply, f"chat {text!r} != generate --chat-template {reply!r}")
            content = r.choices[0].logprobs.content
            check("".join(e.token for e in content) == text
                  and all(len(e.top_logprobs) == 2 for e in content),
                  "chat logprobs spell the reply, two alternatives each")
            streamed = "".join(c.choices[0].delta.content or "" for c in
                               client.chat.completions.create(stream=True, **kw) if c.choices)
            check(streamed == reply, f"streamed chat {streamed!r} != {reply!r}")
            r = client.chat.completions.create(
                model="org/stories-chat", messages=[{"role": "user", "content": "Who is Tom?"}],
                max_tokens=40, temperature=0,
                response_format={"type": "json_schema",
                                 "json_schema": {"name": "Person", "schema": schema,
                                                 "strict": True}})
            text = r.choices[0].message.content
            check(text == structured and text.lstrip().startswith("{"),
                  f"structured chat {text!r} != generate --json-schema {structured!r}")
            if r.choices[0].finish_reason == "stop":
                Person.model_validate_json(text)  # a whole document: the client's class reads it
            # vLLM's extensions through extra_body: a choice is one of its texts; a pattern's
            # whole match is Python's re.fullmatch's (re.ASCII: runtime/regex_dfa.hpp).
            options = ["a cat", "a dog", "the sun"]
            for body in ({"guided_choice": options}, {"structured_outputs": {"choice": options}}):
                r = client.chat.completions.create(extra_body=body, **kw)
                text = r.choices[0].message.content
                check(text in options and r.choices[0].finish_reason == "stop",
                      f"{body}: {text!r} is one of the choices")
            pattern = r"[A-Z][a-z]+ (is|was) \d{1,3}\."
            for body in ({"guided_regex": pattern}, {"structured_outputs": {"regex": pattern}}):
                r = client.chat.completions.create(extra_body=body, **kw)
                text = r.choices[0].message.content
                check(r.choices[0].finish_reason != "stop"
                      or re.fullmatch(pattern, text, re.ASCII) is not None,
                      f"{body}: {text!r} matches whole (finish {r.choices[0].finish_reason})")
        finally:
            proc.terminate()
            proc.communicate(timeout=30)

    return check.report("openai e2e", f"(openai {openai.__version__})")


if __name__ == "__main__":
    sys.exit(main())
