"""The lab's generated text, deterministic per random source: prose of about N cl100k tokens
(:data:`WORDS`, each one token), exactly N (:func:`prose_text`), and code-like or log-like
lines (:func:`fill` of :data:`CODE_LINES`, :data:`LOG_LINES`, named with :data:`IDENT`): the
workloads' instructions, tasks, tool outputs and histories (bench/workload.py) are made of it.
"""

from __future__ import annotations

import random

from inference.tokenizer import decode, encode

# Words that cl100k encodes as one token each (with a leading space), so text sizes are
# close to their target in tokens; the measured sizes are reported in the results anyway.
WORDS = [
    "the",
    "a",
    "to",
    "of",
    "and",
    "in",
    "is",
    "that",
    "for",
    "it",
    "with",
    "as",
    "on",
    "be",
    "this",
    "are",
    "by",
    "or",
    "from",
    "at",
    "an",
    "not",
    "you",
    "your",
    "use",
    "code",
    "file",
    "test",
    "tests",
    "function",
    "class",
    "method",
    "value",
    "values",
    "return",
    "error",
    "errors",
    "call",
    "calls",
    "change",
    "changes",
    "before",
    "after",
    "when",
    "if",
    "then",
    "else",
    "each",
    "every",
    "only",
    "must",
    "should",
    "never",
    "always",
    "run",
    "command",
    "output",
    "input",
    "read",
    "write",
    "path",
    "line",
    "lines",
    "module",
    "package",
    "import",
    "type",
    "types",
    "check",
    "result",
    "results",
    "new",
    "old",
    "first",
    "last",
    "next",
    "make",
    "sure",
    "keep",
    "what",
    "which",
    "where",
    "why",
    "how",
    "user",
    "agent",
    "tool",
    "tools",
    "patch",
    "diff",
    "repository",
    "branch",
    "commit",
    "build",
    "fix",
    "bug",
    "issue",
    "data",
    "list",
    "string",
    "number",
    "object",
    "field",
    "name",
    "names",
    "state",
    "config",
    "server",
    "client",
    "request",
    "response",
    "time",
    "small",
    "large",
    "short",
    "long",
    "simple",
    "clear",
    "exact",
    "same",
    "other",
    "more",
    "less",
    "most",
    "all",
    "any",
    "some",
    "no",
    "one",
    "two",
    "three",
    "work",
    "works",
    "working",
    "need",
    "needs",
    "do",
    "does",
    "done",
    "can",
    "will",
    "may",
    "also",
    "just",
    "now",
    "here",
    "there",
]

CODE_LINES = (
    "def {n}(self, {a}, {b}=None):",
    "    if {a} is None:",
    "        return {b}",
    "    result = self._{n}({a})",
    "    for item in {a}:",
    "        total += item.{b}",
    '    raise ValueError(f"bad {a}: {{{a}!r}}")',
    "class {N}({N}Base):",
    '    """{doc}"""',
    "import {a}",
    "from .{a} import {n}",
    "    return {a}.{n}({b})",
    "    assert {a} == {b}, {a}",
    "    self.{a} = {b}",
    "",
)
LOG_LINES = (
    "tests/test_{a}.py::test_{n}_{b} PASSED",
    "tests/test_{a}.py::test_{n} FAILED",
    "E       AssertionError: assert {a} == {b}",
    "E       +  where {a} = {n}({b})",
    "{a}.py:{num}: in {n}",
    "    {a} = {n}({b})",
    "---------- captured log call ----------",
    "WARNING  {a}:{n}.py:{num} {doc}",
    "===== {num} passed, 1 failed in 0.{num}s =====",
)
IDENT = (
    "config",
    "session",
    "store",
    "parser",
    "render",
    "token",
    "cache",
    "lane",
    "value",
    "item",
    "path",
    "state",
    "event",
    "frame",
    "buffer",
    "handle",
    "limit",
    "count",
)


def prose(rng: random.Random, tokens: int) -> str:
    """Sentences of ``tokens`` words of :data:`WORDS` (about as many cl100k tokens)."""
    words = [rng.choice(WORDS) for _ in range(max(tokens, 1))]
    out, sentence = [], []
    for i, w in enumerate(words):
        sentence.append(w)
        if len(sentence) >= rng.randint(8, 18) or i == len(words) - 1:
            out.append(" ".join(sentence).capitalize() + ".")
            sentence = []
    return " ".join(out)


def prose_text(rng: random.Random, tokens: int) -> str:
    """English-like prose of exactly ``tokens`` cl100k tokens before decoding (the last word
    may be cut, and re-encode a token apart)."""
    if tokens <= 0:
        return ""
    return decode(encode(prose(rng, tokens))[:tokens])


def fill(rng: random.Random, templates: tuple[str, ...], tokens: int) -> str:
    """Code-like or log-like lines of ``tokens`` cl100k tokens (the last line cut to fit)."""
    lines: list[str] = []
    ids: list[int] = []
    while len(ids) < tokens:
        for _ in range(max(1, (tokens - len(ids)) // 7)):  # ~7 tokens a line: about enough
            lines.append(
                rng.choice(templates).format(
                    n=rng.choice(IDENT),
                    a=rng.choice(IDENT),
                    b=rng.choice(IDENT),
                    N=rng.choice(IDENT).title(),
                    num=rng.randint(10, 999),
                    doc=" ".join(rng.choice(WORDS) for _ in range(5)),
                )
            )
        ids = encode("\n".join(lines))
    return decode(ids[:tokens])
