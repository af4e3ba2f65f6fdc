"""The replica's memo of each session's conversation: a prompt that extends it hashes only
what is new, and gets the very block keys, digest — and so the very responses — a full
computation gives; a prompt that does not extend it is computed in full."""

from __future__ import annotations

import asyncio
import random
from array import array

import pytest

from inference import chat_format as cf
from inference.emulator.engine import Engine
from inference.emulator.policy import prompt_digest
from inference.emulator.prefix_cache import as_bytes, block_keys
from inference.emulator.prompt_memo import Known, PromptMemo, digest_of
from inference.types import Done, InferenceRequest
from tests.inference.emulator.conftest import FakeClock

BLOCK = 4


def ids(n: int, seed: int) -> array:
    rng = random.Random(seed)
    return array("I", (rng.randrange(100_000) for _ in range(n)))


def known_of(tokens: array, root: int, memo: PromptMemo, session: str, seed: int = 0) -> None:
    _, digest = digest_of(as_bytes(tokens), seed, None)
    memo.remember(
        session,
        Known(as_bytes(tokens), b"", root, tuple(block_keys(tokens, BLOCK, root=root)), digest),
    )


def test_a_prompt_that_extends_the_conversation_is_recalled():
    memo, conversation = PromptMemo(), ids(101, 1)
    known_of(conversation, 7, memo, "s")
    prompt = array("I", conversation) + ids(30, 2)
    known = memo.recall("s", 7, as_bytes(prompt))
    assert known is not None and known.tokens == 101


def test_the_output_is_part_of_the_remembered_conversation():
    memo, prompt, output = PromptMemo(), ids(40, 1), ids(9, 2)
    memo.remember("s", Known(as_bytes(prompt), as_bytes(output), 0, ()))
    assert memo.recall("s", 0, as_bytes(prompt + output + ids(5, 3))) is not None
    edited = array("I", output)
    edited[-1] += 1
    assert memo.recall("s", 0, as_bytes(prompt + edited + ids(5, 3))) is None


@pytest.mark.parametrize("change", ["one token edited", "shorter", "another root", "another session"])
def test_anything_else_is_not_recalled(change):
    memo, conversation = PromptMemo(), ids(101, 1)
    known_of(conversation, 7, memo, "s")
    prompt, root, session = array("I", conversation) + ids(30, 2), 7, "s"
    if change == "one token edited":
        prompt[50] += 1
    elif change == "shorter":
        prompt = prompt[:100]
    elif change == "another root":
        root = 8
    else:
        session = "t"
    assert memo.recall(session, root, as_bytes(prompt)) is None


def test_the_continued_digest_is_the_full_digest():
    memo, conversation = PromptMemo(), ids(90, 3)
    known_of(conversation[:60], 0, memo, "s", seed=5)  # the digest covers the earlier prompt
    prompt = array("I", conversation) + ids(17, 4)
    known = memo.recall("s", 0, as_bytes(prompt))
    assert known is not None
    assert digest_of(as_bytes(prompt), 5, known)[0] == prompt_digest(prompt, 5)
    assert digest_of(as_bytes(prompt), 6, known)[0] == prompt_digest(prompt, 6)  # another seed: in full


def test_the_least_recently_used_sessions_are_forgotten():
    memo = PromptMemo(capacity=2)
    for session in ("a", "b"):
        known_of(ids(8, 0), 0, memo, session)
    memo.recall("a", 0, as_bytes(ids(8, 0)))  # a is now the most recent
    known_of(ids(8, 0), 0, memo, "c")
    assert len(memo) == 2
    assert memo.recall("b", 0, as_bytes(ids(8, 0))) is None
    assert memo.recall("a", 0, as_bytes(ids(8, 0))) is not None


def test_the_remembered_bytes_are_bounded():
    memo = PromptMemo(max_bytes=100)  # 25 tokens
    known_of(ids(10, 0), 0, memo, "a")
    known_of(ids(10, 0), 0, memo, "b")
    known_of(ids(10, 0), 0, memo, "c")  # 120 bytes with a and b: a goes
    assert [memo.recall(s, 0, as_bytes(ids(10, 0))) is not None for s in "abc"] == [False, True, True]
    known_of(ids(30, 0), 0, memo, "d")  # larger than the bound: not remembered, nothing else lost
    assert memo.recall("d", 0, as_bytes(ids(30, 0))) is None and len(memo) == 2


def conversation(engine: Engine, edit_at: int | None) -> list[list]:
    """Six chained turns of one session (the prompt: the last prompt, the output's ids as
    ``Done`` gave them, a new user message); with ``edit_at``, that turn's prompt has an
    earlier token changed, as a client that rewrote its history would send."""

    async def main() -> list[list]:
        prompt, turns = array("I", cf.render_instructions("Be brief.")), []
        for turn in range(6):
            prompt.extend(cf.render_message("user", f"Step {turn}: fix the next bug in module {turn}."))
            if turn == edit_at:
                prompt[3] += 1
            request = InferenceRequest(
                request_id=f"r{turn}",
                model="emu-test",
                prompt_token_ids=array("I", prompt),
                session_key="sess",
                cache_scope="key:a",
            )
            chunks = [chunk async for chunk in engine.generate(request)]
            done = next(e for chunk in chunks for e in chunk if isinstance(e, Done))
            prompt.extend(done.context_token_ids)
            turns.append(chunks)
        return turns

    return asyncio.run(main())


@pytest.mark.parametrize("edit_at", [None, 3])
def test_a_sessions_responses_are_the_same_with_and_without_the_memo(make_config, edit_at):
    config = make_config(prefix_cache={"block_tokens": BLOCK})
    clocks = FakeClock(), FakeClock()  # one each: items are cut on the clock's grid
    with_memo = Engine(config, clocks[0], clocks[0])
    without = Engine(config, clocks[1], clocks[1])
    without._memo = PromptMemo(capacity=0)
    assert conversation(with_memo, edit_at) == conversation(without, edit_at)
    assert with_memo.prefix_cache.stats() == without.prefix_cache.stats()
    assert len(with_memo._memo) == 1 and len(without._memo) == 0
    assert with_memo._memo.recalled == (5 if edit_at is None else 4)  # the edited turn: in full
