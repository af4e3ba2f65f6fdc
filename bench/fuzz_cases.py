"""The ``fuzz`` kind's hostile client input, as hypothesis strategies (the fuzz tests draw from them too).

:func:`ws_cases` draws WebSocket client frames (non-JSON text, binary frames, invalid UTF-8,
JSON that is not an object, unknown ``type``s, ``response.create`` with mutated fields,
``response.cancel``/``steer``/``append``/``inject``, deep nesting, odd Unicode, very long strings,
frames over the cap); :func:`http_cases` draws HTTP requests (create and compact bodies,
content types, odd response ids, ``input_items`` query junk, other methods).  What the
server must answer, and what a case is, are the oracle's business (:mod:`bench.fuzz_oracle`).

Resource-exhaustion inputs are in too: knob values past the policy's bounds
(``emulator.text_tokens`` of 10^8 → 400), schemas demanding 10^8 items, characters or
properties (→ a call with ``{}`` arguments), and a zlib bomb in a ``compaction`` item
(rendered as the opaque blob it is).  Knob values the server accepts stay small, so a
case never waits on a long answer.
"""

from __future__ import annotations

import base64
import json
import string
import zlib
from collections.abc import Callable
from urllib.parse import quote, urlencode

from hypothesis import strategies as st

from .fuzz_oracle import FRAME_CAP, MODEL, STORED, HttpCase, WsCase

# ------------------------------------------------------------------ values

ODD_STRINGS = [
    "",
    " ",
    "\x00",
    "a\x00b",
    "\ud800",
    "\udfff",
    "x\udbff",
    "\udc00\ud800",
    "\ufeff",
    "\u202e",
    "\uffff",
    "\U0010ffff",
    "💥",
    "é",
    "ǅ",
    "\r\n",
    "\t",
    "null",
    "None",
    "NaN",
    "__proto__",
    "../../etc/passwd",
    "%00",
    "%2F",
    "' OR 1=1 --",
    "{{7*7}}",
    "${jndi:x}",
    "<script>",
    "resp_",
    "resp_0",
    "msg_0",
    "call_0",
    "emu-fast ",
    "EMU-FAST",
    "response.create",
    "ab" * 129,
]
LONG = st.integers(300, 40_000).map(lambda n: "x" * n)
TEXT = st.one_of(st.text(max_size=24), st.sampled_from(ODD_STRINGS), LONG)
NUMBERS = st.one_of(
    st.integers(-(2**70), 2**70),
    st.sampled_from([0, -1, 1, 2, 16, 2**31, 2**63, -(2**63), 10**30, 10**100]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.5, -0.0, 1e-320, 1e308, 2.0000001]),
)
JSONISH = st.recursive(
    st.none() | st.booleans() | NUMBERS | TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=10,
)
WRONG = st.one_of(JSONISH, st.just([]), st.just({}))


def nested(depth: int) -> str:
    """JSON text nested ``depth`` levels deep (objects and arrays alternating): built as
    text, since the json module itself gives up near 1000 levels."""
    opens = "".join('{"a":' if i % 2 == 0 else "[" for i in range(depth))
    closes = "".join("}" if i % 2 == 0 else "]" for i in reversed(range(depth)))
    return opens + "1" + closes


DEEP = st.integers(150, 3000).map(nested)

# ------------------------------------------------------------------ input items and tools

PART = st.fixed_dictionaries(
    {
        "type": st.sampled_from(
            ["input_text", "output_text", "refusal", "input_image", "input_file", "bogus"]
        )
        | WRONG
    },
    optional={
        "text": TEXT | WRONG,
        "refusal": TEXT,
        "image_url": TEXT | WRONG,
        "file_id": TEXT,
        "detail": TEXT,
        "annotations": WRONG,
    },
)
CONTENT = st.one_of(TEXT, st.lists(PART, max_size=3), WRONG)
ROLE = st.sampled_from(["user", "assistant", "system", "developer", "tool", "USER", ""]) | WRONG
BLOB = st.binary(max_size=64).map(lambda b: base64.b64encode(zlib.compress(b)).decode())
# 5 MB of "a" in ~7 KB: over the server's 4 MiB inflation bound for compaction summaries.
BOMB = st.just(base64.b64encode(zlib.compress(b"a" * 5_000_000, 9)).decode())
ITEM = st.one_of(
    st.fixed_dictionaries(
        {"role": ROLE, "content": CONTENT},
        optional={
            "type": st.just("message") | WRONG,
            "id": TEXT | WRONG,
            "status": TEXT | WRONG,
            "phase": TEXT,
            "extra": JSONISH,
        },
    ),
    st.fixed_dictionaries(
        {"type": st.just("function_call")},
        optional={
            "call_id": TEXT | WRONG,
            "name": TEXT | WRONG,
            "arguments": TEXT | WRONG,
            "id": TEXT,
            "status": TEXT | WRONG,
        },
    ),
    st.fixed_dictionaries(
        {"type": st.just("function_call_output")},
        optional={
            "call_id": TEXT | WRONG,
            "output": CONTENT,
            "id": TEXT | WRONG,
            "status": TEXT,
            "junk": JSONISH,
        },
    ),
    st.fixed_dictionaries(
        {"type": st.just("reasoning")},
        optional={
            "id": TEXT | WRONG,
            "summary": st.lists(st.dictionaries(TEXT, JSONISH, max_size=2)) | WRONG,
            "encrypted_content": TEXT | WRONG,
        },
    ),
    st.fixed_dictionaries({"type": st.just("item_reference")}, optional={"id": TEXT | WRONG}),
    st.fixed_dictionaries(
        {"type": st.just("compaction")}, optional={"encrypted_content": TEXT | BLOB | BOMB | WRONG}
    ),
    st.fixed_dictionaries({"type": TEXT | WRONG}, optional={"content": CONTENT, "id": TEXT}),
    WRONG,
)
INPUT = st.one_of(TEXT, st.lists(ITEM, max_size=4), WRONG)

TOOL_NAME = st.sampled_from(["read_file", "f", "a" * 64, "a" * 65, "has space", "dot.name", "ünï", ""]) | TEXT
PROPERTY = st.fixed_dictionaries(
    {"type": st.sampled_from(["string", "integer", "number", "boolean", "array", "object", "null"])},
    optional={"description": st.text(max_size=10)},
)
SMALL = st.one_of(st.none(), st.booleans(), st.integers(-3, 5), st.floats(-3, 5), st.text(max_size=6))
KEYWORDS = st.sampled_from(
    [
        "type",
        "properties",
        "required",
        "items",
        "prefixItems",
        "additionalProperties",
        "allOf",
        "anyOf",
        "oneOf",
        "enum",
        "const",
        "default",
        "$ref",
        "$defs",
        "minItems",
        "maxItems",
        "uniqueItems",
        "minLength",
        "maxLength",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "multipleOf",
        "minProperties",
        "maxProperties",
        "format",
    ]
)
# Schema keywords with values of any shape, but only small numbers (see module doc).
MALFORMED_SCHEMA = st.recursive(
    st.dictionaries(KEYWORDS, SMALL, max_size=4),
    lambda inner: st.dictionaries(
        KEYWORDS,
        st.one_of(
            SMALL, inner, st.lists(inner, max_size=2), st.dictionaries(st.text(max_size=4), inner, max_size=2)
        ),
        max_size=4,
    ),
    max_leaves=12,
)
SCHEMA = st.one_of(
    MALFORMED_SCHEMA,
    st.builds(
        lambda props, req: {"type": "object", "properties": props, "required": [k for k in props if req]},
        st.dictionaries(st.text(string.ascii_letters, min_size=1, max_size=8), PROPERTY, max_size=3),
        st.booleans(),
    ),
    st.sampled_from(
        [
            {},
            {"type": "string"},
            {"type": "array"},
            {"type": ["object", "null"]},
            {"type": "object", "additionalProperties": False},
        ]
    ),
    st.sampled_from(["minItems", "minLength", "minProperties"]).map(  # would stall the replica
        lambda k: {"type": "object", "properties": {"a": {k: 10**8}}, "required": ["a"]}
    ),
    st.lists(JSONISH, max_size=2),
    TEXT,
    st.none(),
    st.booleans(),
)
TOOL = st.one_of(
    st.fixed_dictionaries(
        {"type": st.just("function"), "name": TOOL_NAME},
        optional={"parameters": SCHEMA, "description": TEXT | WRONG, "strict": st.booleans() | WRONG},
    ),
    st.fixed_dictionaries(
        {"type": st.sampled_from(["web_search", "namespace", "file_search", "custom", "mcp"]) | TEXT},
        optional={"name": TEXT, "junk": JSONISH},
    ),
    st.fixed_dictionaries({"type": WRONG, "name": TOOL_NAME}),
    WRONG,
)
TOOLS = st.one_of(st.lists(TOOL, max_size=4), st.lists(TOOL, min_size=129, max_size=130), WRONG)
TOOL_CHOICE = st.one_of(
    st.sampled_from(["auto", "none", "required", "bogus", "read_file", ""]),
    st.fixed_dictionaries(
        {"type": st.sampled_from(["function", "custom", "allowed_tools", "web_search"]) | WRONG},
        optional={"name": TOOL_NAME | WRONG, "mode": st.sampled_from(["auto", "x"]) | WRONG, "tools": WRONG},
    ),
    WRONG,
)
KNOB = st.sampled_from(["emulator.tool_rounds", "emulator.text_tokens", "emulator.seed"])
KNOB_VALUE = st.one_of(
    st.integers(-3, 20).map(str),
    st.sampled_from(["²", "١٢", " 7 ", "0x10", "1e3", "", "+5"]),
    st.sampled_from(["100000000", "65537"]),  # past the bounds: 400 (a seed: fine)
    st.text(max_size=6).filter(lambda v: not _large(v)),
)
METADATA = st.one_of(
    st.dictionaries(TEXT, TEXT, max_size=4),
    st.dictionaries(st.text(max_size=8), st.text(max_size=4), min_size=17, max_size=20),
    st.dictionaries(KNOB, KNOB_VALUE, max_size=3),
    st.dictionaries(st.text(max_size=8), WRONG, min_size=1, max_size=3),
    WRONG,
)
TEXT_CONFIG = st.one_of(
    st.fixed_dictionaries(
        {},
        optional={
            "format": st.fixed_dictionaries(
                {"type": st.sampled_from(["text", "json_object", "json_schema", "x"]) | WRONG},
                optional={"schema": WRONG, "name": TEXT, "strict": WRONG},
            )
            | WRONG,
            "verbosity": st.sampled_from(["low", "high", "loud"]) | WRONG,
        },
    ),
    WRONG,
)
STREAM_ID = st.one_of(
    st.from_regex(r"[A-Za-z0-9_.\-]{1,8}", fullmatch=True),
    st.sampled_from(["", "a b", "x" * 257]),
    TEXT,
    WRONG,
)
ID = st.one_of(st.text(string.hexdigits, max_size=48).map("resp_".__add__), TEXT, WRONG)
INT = st.one_of(NUMBERS, WRONG)

CREATE_FIELDS: dict[str, st.SearchStrategy[object]] = {
    "model": st.sampled_from(["emu-fast", "emu-gpu", "EMU-FAST", "gpt-4o", ""]) | TEXT | WRONG,
    "input": INPUT,
    "previous_response_id": ID,
    "instructions": TEXT | WRONG,
    "tools": TOOLS,
    "tool_choice": TOOL_CHOICE,
    "parallel_tool_calls": WRONG,
    "store": WRONG,
    "stream": WRONG,
    "background": WRONG,
    "generate": WRONG,
    "max_output_tokens": INT,
    "max_tool_calls": INT,
    "top_logprobs": INT,
    "temperature": INT,
    "top_p": INT,
    "metadata": METADATA,
    "text": TEXT_CONFIG,
    "reasoning": st.fixed_dictionaries({}, optional={"effort": TEXT | WRONG, "summary": WRONG}) | WRONG,
    "truncation": st.sampled_from(["auto", "disabled", "x"]) | WRONG,
    "user": TEXT | WRONG,
    "service_tier": TEXT | WRONG,
    "include": st.lists(TEXT, max_size=3) | WRONG,
    "prompt_cache_key": TEXT | WRONG,
    "prompt_cache_retention": TEXT | WRONG,
    "prompt_cache_options": st.fixed_dictionaries({}, optional={"prewarm": WRONG}) | WRONG,
    "safety_identifier": TEXT | WRONG,
    "stream_options": WRONG,
    "client_metadata": WRONG,
    "context_management": st.lists(
        st.fixed_dictionaries(
            {"type": st.sampled_from(["compaction", "other"]) | WRONG},
            optional={"compact_threshold": st.sampled_from([1000, 4096]) | INT, "junk": JSONISH},
        ),
        max_size=2,
    )
    | WRONG,
    "multi_agent": st.fixed_dictionaries(
        {"enabled": st.booleans()}, optional={"max_concurrent_subagents": INT}
    )
    | WRONG,
    "conversation": TEXT | WRONG,
    "stream_id": STREAM_ID,
    "event_id": TEXT,
    "unknown_field": JSONISH,
}


@st.composite
def create_body(draw: st.DrawFn, fields: dict[str, st.SearchStrategy[object]] = CREATE_FIELDS) -> dict:
    """A plausible create (short answer, no storage) with one to four fields mutated or dropped."""
    body: dict[str, object] = {"model": MODEL, "input": "hi", "store": False}
    for name in draw(st.lists(st.sampled_from(sorted(fields)), min_size=1, max_size=4, unique=True)):
        if name in body and draw(st.integers(0, 5)) == 0:
            del body[name]
        else:
            body[name] = draw(fields[name])
    return body


def _large(text: str) -> bool:
    try:
        return abs(int(text)) > 100  # "emulator.text_tokens": "999999" is ~2 s of model time
    except ValueError:
        return False


def dumps(value: object, ascii_only: bool = True) -> str:
    """JSON text; lone surrogates always travel as ``\\ud800`` escapes."""
    try:
        text = json.dumps(value, ensure_ascii=ascii_only)
        text.encode()
        return text
    except UnicodeEncodeError:
        return json.dumps(value)


def _frame(kind: str, append_mode: bool = False) -> Callable[[tuple[object, bool]], WsCase]:
    return lambda pair: WsCase(kind, dumps(pair[0], pair[1]), append_mode)


def _event(type_: object, fields: dict[str, st.SearchStrategy[object]]) -> st.SearchStrategy[dict]:
    return st.fixed_dictionaries({"type": st.just(type_)}, optional=fields)


ASCII = st.booleans()
ITEMS = st.lists(ITEM, max_size=3) | WRONG
WS_KINDS = (
    "not_json",
    "binary",
    "bad_utf8",
    "json_not_object",
    "unknown_type",
    "create",
    "nested_create",
    "cancel",
    "steer",
    "append",
    "append_on_standard",
    "inject",
    "inject_on_append",
    "processed",
    "deep",
    "oversize",
)


def ws_cases() -> st.SearchStrategy[WsCase]:
    not_json = st.one_of(
        st.text(max_size=40),
        st.sampled_from(
            [
                "",
                " ",
                "{",
                "{oops",
                "[1,",
                "{'a': 1}",
                '{"type":"response.create",}',
                "true false",
                "\x00",
                '{"type": "response.create"',
                "\ufeff{}",
                "NaN",
                "--",
            ]
        ),
    ).filter(_not_json)
    return st.one_of(
        not_json.map(lambda t: WsCase("not_json", t)),
        st.one_of(
            st.binary(max_size=96),
            create_body().map(lambda b: json.dumps({"type": "response.create", **b}).encode()),
        ).map(lambda b: WsCase("binary", b)),
        st.sampled_from([b"\xff", b'{"type":"\xc3"}', b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80"]).map(
            lambda b: WsCase("bad_utf8", b, as_text=True)
        ),
        st.tuples(JSONISH.filter(lambda v: not isinstance(v, dict)), ASCII).map(_frame("json_not_object")),
        st.tuples(
            st.fixed_dictionaries(
                {},
                optional={"type": (TEXT | WRONG).filter(_not_client_type), "response_id": ID, "input": INPUT},
            ),
            ASCII,
        ).map(_frame("unknown_type")),
        *[
            st.tuples(create_body().map(lambda b: {"type": "response.create", **b}), ASCII).map(
                _frame("create")
            )
            for _ in range(4)
        ],  # creates are the richest input: drawn four times as often
        st.tuples(create_body().map(lambda b: {"type": "response.create", "response": b}), ASCII).map(
            _frame("nested_create")
        ),
        st.tuples(_event("response.cancel", {"response_id": ID, "stream_id": STREAM_ID}), ASCII).map(
            _frame("cancel")
        ),
        st.tuples(
            _event(
                "response.steer",
                {
                    "previous_response_id": ID,
                    "input": st.one_of(TEXT, ITEMS),
                    "stream_id": STREAM_ID,
                    "event_id": TEXT,
                    "junk": JSONISH,
                },
            ),
            ASCII,
        ).map(_frame("steer")),
        st.tuples(_event("response.append", {"response_id": ID, "input": ITEMS, "junk": JSONISH}), ASCII).map(
            _frame("append", append_mode=True)
        ),
        st.tuples(_event("response.append", {"response_id": ID, "input": ITEMS}), ASCII).map(
            _frame("append_on_standard")
        ),
        st.tuples(
            _event(
                "response.inject",
                {
                    "response_id": ID,
                    "input": ITEMS,
                    "stream_id": STREAM_ID,
                    "event_id": TEXT,
                    "junk": JSONISH,
                },
            ),
            ASCII,
        ).map(_frame("inject")),
        st.tuples(_event("response.inject", {"response_id": ID, "input": ITEMS}), ASCII).map(
            _frame("inject_on_append", append_mode=True)
        ),
        st.tuples(_event("response.processed", {"response_id": ID, "junk": JSONISH}), ASCII).map(
            _frame("processed")
        ),
        st.tuples(
            st.sampled_from(["input", "metadata", "tools", "text", "instructions", "tool_choice", None]), DEEP
        ).map(_deep_frame),
        st.integers(FRAME_CAP + 1, 2 * FRAME_CAP).map(
            lambda n: WsCase("oversize", dumps({"type": "response.create", "model": MODEL, "input": "x" * n}))
        ),
    )


def _deep_frame(pair: tuple[str | None, str]) -> WsCase:
    where, deep = pair
    if where is None:
        return WsCase("deep", deep)
    value: object = "__deep__"
    if where == "tools":
        value = [{"type": "function", "name": "f", "parameters": {"type": "object", "x": value}}]
    frame = dumps({"type": "response.create", "model": MODEL, "store": False, "input": "hi", where: value})
    return WsCase("deep", frame.replace('"__deep__"', deep))


def _not_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return True
    return False


def _not_client_type(value: object) -> bool:
    return value not in (
        "response.create",
        "response.steer",
        "response.append",
        "response.inject",
        "response.processed",
    )


# ------------------------------------------------------------------ HTTP

HTTP_FIELDS = {k: v for k, v in CREATE_FIELDS.items() if k not in ("stream_id", "generate", "event_id")}
CONTENT_TYPES = st.sampled_from(
    [
        None,
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "application/json; charset=latin-1",
        "application/octet-stream",
        "application/json;;;",
        "*/*",
    ]
)
PATH_ID = st.one_of(
    TEXT, st.just(STORED), st.sampled_from(["..", ".", "%2e%2e", "a/b", "a?b", "a#b", "resp_0"])
)
QUERY_VALUE = st.one_of(
    st.integers(-5, 200).map(str),
    TEXT,
    st.sampled_from(["asc", "desc", "ASC", "1e3", "0x10", "9" * 5000, "٣"]),
)
HTTP_KINDS = (
    "post_junk",
    "post_json",
    "post_create",
    "post_stream",
    "content_type",
    "get",
    "delete",
    "input_items",
    "compact",
    "method",
)


def _body(value: object) -> bytes:
    return dumps(value).encode()


def _quoted(raw: str) -> str:
    return quote(raw.encode("utf-8", "surrogatepass"), safe="") if raw != STORED else STORED


MAX_URL = 60_000  # uvicorn's parser refuses URLs of 64 KiB and more with a plain-text 400


def http_cases() -> st.SearchStrategy[HttpCase]:
    compact_fields = {
        "model": CREATE_FIELDS["model"],
        "input": INPUT,
        "previous_response_id": ID,
        "instructions": TEXT | WRONG,
        "junk": JSONISH,
    }
    return st.one_of(
        st.one_of(st.binary(max_size=96), st.text(max_size=40).map(str.encode)).map(
            lambda b: HttpCase("post_junk", "POST", "/v1/responses", b)
        ),
        JSONISH.filter(lambda v: not isinstance(v, dict)).map(
            lambda v: HttpCase("post_json", "POST", "/v1/responses", _body(v))
        ),
        *[
            create_body(HTTP_FIELDS).map(lambda b: HttpCase("post_create", "POST", "/v1/responses", _body(b)))
            for _ in range(3)
        ],
        create_body(HTTP_FIELDS).map(
            lambda b: HttpCase("post_stream", "POST", "/v1/responses", _body({**b, "stream": True}))
        ),
        st.tuples(
            CONTENT_TYPES,
            st.sampled_from(
                [
                    b'{"model":"emu-fast","input":"h\xe9"}',
                    b"model=emu-fast&input=x",
                    b'{"model":"emu-fast","input":"hi","store":false}',
                ]
            ),
        ).map(lambda p: HttpCase("content_type", "POST", "/v1/responses", p[1], p[0])),
        PATH_ID.map(lambda i: HttpCase("get", "GET", f"/v1/responses/{_quoted(i)}", None, None)),
        PATH_ID.filter(lambda i: i != STORED).map(
            lambda i: HttpCase("delete", "DELETE", f"/v1/responses/{_quoted(i)}", None, None)
        ),
        st.tuples(
            PATH_ID,
            st.lists(
                st.tuples(st.sampled_from(["limit", "order", "after", "include[]", "x"]), QUERY_VALUE),
                max_size=4,
            ),
        )
        .map(
            lambda p: HttpCase(
                "input_items",
                "GET",
                f"/v1/responses/{_quoted(p[0])}/input_items?"
                + urlencode([(k, v.encode("utf-8", "surrogatepass")) for k, v in p[1]]),
                None,
                None,
            )
        )
        .filter(lambda case: len(case.path) < MAX_URL),
        st.fixed_dictionaries({}, optional=compact_fields).map(
            lambda b: HttpCase("compact", "POST", "/v1/responses/compact", _body(b))
        ),
        st.tuples(
            st.sampled_from(["PUT", "PATCH", "OPTIONS", "GET", "DELETE", "POST"]),
            st.sampled_from(
                [
                    "/v1/responses",
                    "/v1/responses/x",
                    "/v1/responses/x/input_items",
                    "/v1/responses/compact",
                    "/v1/responses/x/cancel",
                    "/v1",
                    "/v1/models/%00",
                ]
            ),
        ).map(lambda p: HttpCase("method", p[0], p[1], b"{}" if p[0] in ("PUT", "PATCH", "POST") else None)),
    )
