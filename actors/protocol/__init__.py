"""The wire protocol, split by concept (docs/protocol.md):

- :mod:`.requests` — inbound client events and HTTP create bodies, and the one parse point
  (:func:`parse_client_event`, :func:`parse_http_create`);
- :mod:`.events` — the Response object, every server event, and the one encode point
  (:func:`encode`; errors become wire events only in :func:`error_event` / :func:`http_error_body`);
- :mod:`.items` — input and output items and their stored form.

Nothing else in the project branches on ``"type"`` strings.
"""

from .items import (  # noqa: F401
    InputText,
    OutputTextIn,
    Refusal,
    InputImage,
    InputFile,
    ContentPart,
    MessageItem,
    FunctionCallItem,
    FunctionCallOutputItem,
    ReasoningItem,
    ItemReference,
    CompactionItem,
    InputItem,
    OutputText,
    OutputMessage,
    OutputFunctionCall,
    OutputItem,
    ITEM_ADAPTER,
    item_dict,
    output_as_input,
    parse_items,
)
from .requests import (  # noqa: F401
    FunctionTool,
    OtherTool,
    Tool,
    Temperature,
    TopP,
    Metadata,
    TOOL_CHOICE_MODES,
    ResponseCreate,
    ResponseSteer,
    ResponseProcessed,
    ResponseAppend,
    ClientEvent,
    load_json_object,
    parse_client_event,
    parse_http_create,
)
from .events import (  # noqa: F401
    InputTokensDetails,
    OutputTokensDetails,
    Usage,
    RESPONSE_ERROR_CODES,
    ResponseErrorBody,
    IncompleteDetails,
    ResponseObject,
    ResponseCreated,
    ResponseInProgress,
    ResponseCompleted,
    ResponseIncomplete,
    ResponseFailed,
    TERMINAL_EVENT_TYPES,
    OutputItemAdded,
    OutputItemDone,
    ContentPartAdded,
    ContentPartDone,
    OutputTextDelta,
    OutputTextDone,
    FunctionCallArgumentsDelta,
    FunctionCallArgumentsDone,
    ErrorDetail,
    ErrorEvent,
    SteerFailedError,
    SteerFailed,
    SteerRef,
    SteerAccepted,
    RequiredInput,
    SteerPending,
    ServerEvent,
    encode,
    error_event,
    http_error_body,
)
