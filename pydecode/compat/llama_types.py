"""llama-cpp-python's llama_types: the TypedDicts its API takes and returns (OpenAI's shapes).
Annotations only: at run time they are plain dicts, as there."""
from __future__ import annotations

from typing import Any, Dict, List, Literal, Optional, TypedDict, Union

JsonType = Union[None, int, str, bool, List[Any], Dict[str, Any]]


class EmbeddingUsage(TypedDict):
    prompt_tokens: int
    total_tokens: int


class Embedding(TypedDict):
    index: int
    object: str
    embedding: Union[List[float], List[List[float]]]


class CreateEmbeddingResponse(TypedDict):
    object: Literal["list"]
    model: str
    data: List[Embedding]
    usage: EmbeddingUsage


class CompletionLogprobs(TypedDict):
    text_offset: List[int]
    token_logprobs: List[Optional[float]]
    tokens: List[str]
    top_logprobs: List[Optional[Dict[str, float]]]


class CompletionChoice(TypedDict):
    text: str
    index: int
    logprobs: Optional[CompletionLogprobs]
    finish_reason: Optional[Literal["stop", "length"]]


class CompletionUsage(TypedDict):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CreateCompletionResponse(TypedDict, total=False):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: List[CompletionChoice]
    usage: CompletionUsage


CreateCompletionStreamResponse = CreateCompletionResponse
Completion = CreateCompletionResponse
CompletionChunk = CreateCompletionResponse


class ChatCompletionFunction(TypedDict, total=False):
    name: str
    description: str
    parameters: Dict[str, JsonType]


class ChatCompletionResponseFunctionCall(TypedDict):
    name: str
    arguments: str


class ChatCompletionMessageToolCallFunction(TypedDict):
    name: str
    arguments: str


class ChatCompletionMessageToolCall(TypedDict):
    id: str
    type: Literal["function"]
    function: ChatCompletionMessageToolCallFunction


class ChatCompletionResponseMessage(TypedDict, total=False):
    role: Literal["assistant", "function"]
    content: Optional[str]
    tool_calls: List[ChatCompletionMessageToolCall]
    function_call: ChatCompletionResponseFunctionCall


class ChatCompletionResponseChoice(TypedDict):
    index: int
    message: ChatCompletionResponseMessage
    logprobs: Optional[Dict[str, Any]]
    finish_reason: Optional[str]


class CreateChatCompletionResponse(TypedDict, total=False):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: List[ChatCompletionResponseChoice]
    usage: CompletionUsage


class ChatCompletionStreamResponseDelta(TypedDict, total=False):
    role: Literal["assistant"]
    content: Optional[str]
    tool_calls: List[Dict[str, Any]]
    function_call: Dict[str, Any]


class ChatCompletionStreamResponseChoice(TypedDict):
    index: int
    delta: ChatCompletionStreamResponseDelta
    finish_reason: Optional[str]
    logprobs: Optional[Dict[str, Any]]


class CreateChatCompletionStreamResponse(TypedDict, total=False):
    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: List[ChatCompletionStreamResponseChoice]


ChatCompletion = CreateChatCompletionResponse
ChatCompletionChunk = CreateChatCompletionStreamResponse


class ChatCompletionRequestMessageContentPartText(TypedDict):
    type: Literal["text"]
    text: str


class ChatCompletionRequestSystemMessage(TypedDict, total=False):
    role: Literal["system"]
    content: Optional[str]


class ChatCompletionRequestUserMessage(TypedDict, total=False):
    role: Literal["user"]
    content: Optional[Union[str, List[ChatCompletionRequestMessageContentPartText]]]


class ChatCompletionRequestAssistantMessage(TypedDict, total=False):
    role: Literal["assistant"]
    content: Optional[str]
    tool_calls: List[ChatCompletionMessageToolCall]
    function_call: ChatCompletionResponseFunctionCall


class ChatCompletionRequestToolMessage(TypedDict):
    role: Literal["tool"]
    content: Optional[str]
    tool_call_id: str


class ChatCompletionRequestFunctionMessage(TypedDict):
    role: Literal["function"]
    content: Optional[str]
    name: str


ChatCompletionRequestMessage = Union[ChatCompletionRequestSystemMessage, ChatCompletionRequestUserMessage,
                                     ChatCompletionRequestAssistantMessage, ChatCompletionRequestToolMessage,
                                     ChatCompletionRequestFunctionMessage]


class ChatCompletionRequestFunctionCallOption(TypedDict):
    name: str


ChatCompletionRequestFunctionCall = Union[Literal["none", "auto"], ChatCompletionRequestFunctionCallOption]


class ChatCompletionToolFunction(TypedDict, total=False):
    name: str
    description: str
    parameters: Dict[str, JsonType]


class ChatCompletionTool(TypedDict):
    type: Literal["function"]
    function: ChatCompletionToolFunction


class ChatCompletionNamedToolChoiceFunction(TypedDict):
    name: str


class ChatCompletionNamedToolChoice(TypedDict):
    type: Literal["function"]
    function: ChatCompletionNamedToolChoiceFunction


ChatCompletionToolChoiceOption = Union[Literal["none", "auto", "required"], ChatCompletionNamedToolChoice]


class ChatCompletionRequestResponseFormat(TypedDict, total=False):
    type: Literal["text", "json_object"]
    schema: JsonType
