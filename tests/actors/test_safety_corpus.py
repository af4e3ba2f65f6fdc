"""False positives: several MB of ordinary text the classifier must not flag.

Random text in every case mix, source code (this project's and the standard library's),
base64, hex dumps and log lines — each document classified on its own, as a conversation
would be.  Seeded, so a failure names a reproducible document.  No document may score a
secret; the only flags allowed are on source files that quote an injection marker or a
lexicon term (the classifier's own module and its tests): true positives.  (The true
positives of every credential shape are in ``test_safety.py``.)
"""

from __future__ import annotations

import base64
import random
import string
import sysconfig
from collections.abc import Iterator
from pathlib import Path

from actors.core.safety import INJECTION_MARKERS, Classifier, SafetyConfig, build_matcher

ROOT = Path(__file__).resolve().parents[2]
PROJECT = ("actors", "bench", "inference", "serve", "store", "tests")
STDLIB = Path(sysconfig.get_paths()["stdlib"])
CONFIG = SafetyConfig()
MATCHER = build_matcher(CONFIG)
MB = 1 << 20


def words(rng: random.Random, alphabet: str, size: int, longest: int = 24) -> str:
    out, n = [], 0
    while n < size:
        word = "".join(rng.choices(alphabet, k=rng.randint(1, longest)))
        out.append(word + rng.choice("     \n.,;:"))
        n += len(out[-1])
    return "".join(out)


def log_lines(rng: random.Random, size: int) -> str:
    levels = ("DEBUG", "INFO", "WARNING", "ERROR")
    out, n = [], 0
    while n < size:
        line = (
            f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T{rng.randint(0, 23):02d}:"
            f"{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}.{rng.randint(0, 999999):06d}Z "
            f"{rng.choice(levels)} [{rng.choice(('api', 'worker', 'auth', 'db'))}-{rng.randint(0, 99)}] "
            f"request_id={rng.getrandbits(128):032x} user=u{rng.randint(0, 10**6)} "
            f"path=/v1/{rng.choice(('responses', 'models', 'files'))}/{rng.getrandbits(64):016X} "
            f"status={rng.choice((200, 201, 400, 404, 500))} took_ms={rng.random() * 1000:.3f} "
            f'task-{rng.getrandbits(40):010x} desk-{rng.randint(0, 999)} ua="{words(rng, string.ascii_letters, 30, 8).strip()}"\n'
        )
        out.append(line)
        n += len(line)
    return "".join(out)


def hex_dump(rng: random.Random, size: int, upper: bool) -> str:
    data = rng.randbytes(size // 4)
    lines = []
    for offset in range(0, len(data), 16):
        row = data[offset : offset + 16]
        hexed = " ".join(row[i : i + 2].hex() for i in range(0, len(row), 2))
        text = "".join(chr(b) if 32 <= b < 127 else "." for b in row)
        lines.append(f"{offset:08x}: {hexed.upper() if upper else hexed}  {text}")
    return "\n".join(lines) + "\n" + data.hex().upper()


def source_files(paths: Iterator[Path], limit: int) -> Iterator[tuple[str, str]]:
    total = 0
    for path in paths:
        if total >= limit:
            return
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        total += len(text)
        yield str(path), text


def corpus() -> Iterator[tuple[str, str]]:
    rng = random.Random(20240501)
    for i in range(3000):  # the reported case: 3000 turns of random lower-case text
        yield f"lower-case turn {i}", words(rng, string.ascii_lowercase, 500, longest=100)
    yield "lower-case, no spaces", "".join(rng.choices(string.ascii_lowercase, k=MB))
    yield "mixed case", words(rng, string.ascii_letters, MB // 2)
    yield "mixed case and digits", words(rng, string.ascii_letters + string.digits, MB // 2, longest=40)
    yield "upper case and digits", words(rng, string.ascii_uppercase + string.digits, MB // 4)
    yield "lower case and digits, _ and -", words(rng, string.ascii_lowercase + string.digits + "_-", MB // 4)
    yield "base64", base64.b64encode(rng.randbytes(MB // 2)).decode()
    yield "base64, wrapped", base64.encodebytes(rng.randbytes(MB // 4)).decode()
    yield "urlsafe base64", base64.urlsafe_b64encode(rng.randbytes(MB // 4)).decode()
    yield "hex dump", hex_dump(rng, MB // 2, upper=False)
    yield "HEX DUMP", hex_dump(rng, MB // 2, upper=True)
    yield "log lines", log_lines(rng, MB // 2)
    yield from source_files((p for d in PROJECT for p in sorted((ROOT / d).rglob("*.py"))), 2 * MB)
    yield from source_files(iter(sorted(STDLIB.rglob("*.py"))), 3 * MB)


def quotes_a_phrase(text: str) -> bool:
    lowered = text.lower()
    return any(phrase in lowered for phrase in INJECTION_MARKERS + CONFIG.lexicon)


def test_several_megabytes_of_ordinary_text_raise_no_flag():
    flagged, size = [], 0
    for name, text in corpus():
        c = Classifier(MATCHER, CONFIG.thresholds)
        c.feed(text)
        size += len(text)
        verdict = c.verdict
        if "secret" in dict(verdict.scores) or (verdict.flagged and not quotes_a_phrase(text)):
            flagged.append((name, verdict))
    assert size > 8 * MB
    assert flagged == []
