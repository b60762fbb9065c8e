"""Reasoning shown apart (pydecode/chat/reasoning.py): the splitter over Qwen3's <think> and
gpt-oss's harmony channels, whole and streamed in every cut, the format chosen from the
template, the history a ChatSession keeps (the templates drop the reasoning as they say), and
the server's reasoning_content (over a tiny random model made to reason by a grammar). No real
model needed: the session runs over a stand-in LLM."""
import json
from pathlib import Path

import pytest

from pydecode import openai_format as oai
from pydecode.chat import ChatSession, render
from pydecode.chat.reasoning import (CHANNEL, CONTENT, HARMONY, REASONING, THINK, ReasoningSplitter, assistant_message,
                                     for_template, opens_reasoning, reasoning_format, split_reasoning)

TEMPLATES = Path(__file__).resolve().parent / "data" / "chat-templates"   # llama.cpp's (MIT, data/LICENSE.ggml)
QWEN3 = (TEMPLATES / "Qwen-Qwen3-0.6B.jinja").read_text()
QWEN35 = (TEMPLATES / "Qwen3.5-4B.jinja").read_text()
GPT_OSS = (TEMPLATES / "openai-gpt-oss-120b.jinja").read_text()
LLAMA31 = (TEMPLATES / "meta-llama-Llama-3.1-8B-Instruct.jinja").read_text()
GEMMA4 = (TEMPLATES / "google-gemma-4-31B-it.jinja").read_text()

THINK_TEXT = "<think>\nThe user asks 2+2.\n\nThat is 4.\n</think>\n\nIt is **4**."
HARMONY_TEXT = ("<|channel|>analysis<|message|>User asks 2+2. Answer 4.<|end|>"
                "<|start|>assistant<|channel|>final<|message|>It is 4.")

CALL_TEXT = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Oslo\"}"
CASES = [
    # (format, opened, generated text, reasoning, answer)
    (THINK, False, THINK_TEXT, "The user asks 2+2.\n\nThat is 4.", "It is **4**."),
    (THINK, False, "\n<think>\nhm\n</think>\n\nok", "hm", "ok"),
    (THINK, False, "<think>\n\n</think>\n\nok", "", "ok"),                 # enable_thinking=False's shape
    (THINK, False, "No reasoning at all.", "", "No reasoning at all."),
    (THINK, False, "a </think> b", "", "a </think> b"),                     # no open: text as it is
    (THINK, True, "Let me see.\n</think>\n\nIt is 4.", "Let me see.", "It is 4."),  # opened in the prompt
    (THINK, True, "cut off in the middle\n\n", "cut off in the middle", ""),
    (THINK, False, "<think>x</think>y<think>z</think>", "x", "y<think>z</think>"),  # one reasoning, first
    (HARMONY, False, HARMONY_TEXT, "User asks 2+2. Answer 4.", "It is 4."),
    (HARMONY, False, "<|channel|>final<|message|>Just 4.", "", "Just 4."),
    (HARMONY, False, "<|channel|>analysis<|message|>thinking, cut", "thinking, cut", ""),
    (HARMONY, False, "<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>analysis<|message|>b<|end|>"
                     "<|start|>assistant<|channel|>final<|message|>c", "ab", "c"),
    # a tool call is not reasoning: handed on, in one spelling, for chat/tools.py's harmony syntax
    (HARMONY, False, "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Oslo\"}",
     "", CALL_TEXT),
    (HARMONY, False, "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant to=functions.get_weather"
                     "<|channel|>commentary json<|message|>{\"city\": \"Oslo\"}", "Need weather.", CALL_TEXT),
    (HARMONY, False, "plain text from a confused model", "", "plain text from a confused model"),
    (None, False, "<think>not a reasoning model</think>", "", "<think>not a reasoning model</think>"),
    (CHANNEL, False, "<|channel>thought\nThe user asks 2+2.<channel|>It is 4.", "The user asks 2+2.", "It is 4."),
    (CHANNEL, False, "<|channel>thought\n<channel|>It is 4.", "", "It is 4."),
    (CHANNEL, False, "It is 4.", "", "It is 4."),
    (CHANNEL, False, "<|channel>thoughtful words<channel|>x", "ful words", "x"),   # the name goes, only it
]


@pytest.mark.parametrize("fmt, opened, text, reasoning, answer", CASES)
def test_split_whole_and_streamed_in_every_cut(fmt, opened, text, reasoning, answer):
    assert split_reasoning(text, fmt, opened) == (reasoning, answer)
    for step in (1, 2, 3, 5, 7, 11):
        s = ReasoningSplitter(fmt, opened)
        parts = []
        for i in range(0, len(text), step):
            parts += s.feed(text[i:i + step])
        parts += s.flush()
        assert "".join(t for k, t in parts if k == REASONING) == reasoning, step
        assert "".join(t for k, t in parts if k == CONTENT) == answer, step
        # Every reasoning part comes before every answer part (where the answer follows it).
        kinds = [k for k, _ in parts]
        if reasoning and answer and fmt == THINK:
            assert kinds.index(CONTENT) > max(i for i, k in enumerate(kinds) if k == REASONING)


def test_streaming_shows_text_as_soon_as_it_cannot_be_a_marker():
    s = ReasoningSplitter(THINK)
    assert s.feed("<thi") == []                       # could still be <think>
    assert s.feed("nk>\nWell") == [(REASONING, "Well")]
    assert s.feed(",\n") == [(REASONING, ",")]        # a newline may end the reasoning: held
    assert s.feed("so</") == [(REASONING, "\nso")]
    assert s.feed("think>\n\nFour") == [(CONTENT, "Four")]
    assert s.feed(" <") == [(CONTENT, " ")]
    assert s.flush() == [(CONTENT, "<")]


def test_format_from_the_template_or_the_vocabulary():
    assert reasoning_format(QWEN3) == THINK
    assert reasoning_format(QWEN35) == THINK
    assert reasoning_format((TEMPLATES / "Qwen-QwQ-32B.jinja").read_text()) == THINK
    assert reasoning_format((TEMPLATES / "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja").read_text()) == THINK
    assert reasoning_format(GPT_OSS) == HARMONY
    assert reasoning_format(GEMMA4) == CHANNEL
    for plain in ("meta-llama-Llama-3.1-8B-Instruct", "microsoft-Phi-3.5-mini-instruct",
                  "Qwen-Qwen2.5-7B-Instruct"):
        assert reasoning_format((TEMPLATES / f"{plain}.jinja").read_text()) is None, plain

    class Vocab:  # single tokens for the given texts
        def __init__(self, *singles):
            self.singles = singles

        def encode(self, text, add_special=True, parse_special=True):
            return [0] if text in self.singles else [0, 1]

    assert reasoning_format(None, Vocab("<think>", "</think>")) == THINK
    assert reasoning_format(None, Vocab("<|channel|>", "<|message|>", "<|return|>")) == HARMONY
    assert reasoning_format(None, Vocab("<think>")) is None
    assert reasoning_format(LLAMA31, Vocab("<think>", "</think>")) is None   # the template says none


def test_prompt_that_opens_the_reasoning():
    user = [{"role": "user", "content": "Hi"}]
    assert not opens_reasoning(render(user, QWEN3), THINK)
    assert opens_reasoning(render(user, QWEN35), THINK)                     # ends with "<think>\n"
    assert not opens_reasoning(render(user, QWEN35, enable_thinking=False), THINK)
    assert not opens_reasoning(render(user, QWEN3, enable_thinking=False), THINK)
    assert not opens_reasoning("<think>", HARMONY)
    assert not opens_reasoning(render(user, GEMMA4, bos_token="<bos>"), CHANNEL)      # closed empty
    assert not opens_reasoning(render(user, GEMMA4, bos_token="<bos>", enable_thinking=True), CHANNEL)
    assert opens_reasoning("<|turn>model\n<|channel>", CHANNEL)


# ------------------------------------------------------------------ the history and the templates

HISTORY = [
    {"role": "user", "content": "What is 2+2?"},
    assistant_message("The user asks 2+2.", "4."),
    {"role": "user", "content": "And 3+3?"},
]


def test_qwen3_template_drops_earlier_reasoning_and_keeps_a_tool_chains():
    assert HISTORY[1] == {"role": "assistant", "content": "4.", "reasoning_content": "The user asks 2+2."}
    text = render(HISTORY, QWEN3)
    assert "The user asks" not in text and "<|im_start|>assistant\n4.<|im_end|>" in text
    # After the last user message (a tool-call chain) the template keeps the reasoning.
    chain = HISTORY + [
        {"role": "assistant", "content": "", "reasoning_content": "Need the tool.",
         "tool_calls": [{"function": {"name": "add", "arguments": {"a": 3, "b": 3}}}]},
        {"role": "tool", "content": "6"},
    ]
    text = render(chain, QWEN3)
    assert "<|im_start|>assistant\n<think>\nNeed the tool.\n</think>\n\n<tool_call>" in text
    assert "The user asks" not in text


def test_gpt_oss_template_reads_reasoning_as_thinking_and_drops_it():
    msgs = for_template(HISTORY, HARMONY)
    assert msgs[1] == {"role": "assistant", "content": "4.", "thinking": "The user asks 2+2."}
    assert for_template(HISTORY, THINK) is HISTORY and for_template(HISTORY, None) is HISTORY
    text = render(msgs, GPT_OSS)
    assert "The user asks" not in text
    assert "<|start|>assistant<|channel|>final<|message|>4.<|end|>" in text
    # For training (the last turn, no generation prompt) the template writes the analysis.
    text = render(msgs[:2], GPT_OSS, add_generation_prompt=False)
    assert text.endswith("<|start|>assistant<|channel|>analysis<|message|>The user asks 2+2.<|end|>"
                         "<|start|>assistant<|channel|>final<|message|>4.<|return|>")


class _Stream:
    def __init__(self, text, finish="stop"):
        self.pieces = [type("Piece", (), {"text": text[i:i + 3]})() for i in range(0, len(text), 3)]
        self.completion = type("Completion", (), {"text": text, "finish_reason": finish})()

    def __iter__(self):
        return iter(self.pieces)


class _LLM:
    """What ChatSession uses of an LLM, answering with given texts, rendering a real template."""
    n_ctx = 4096

    def __init__(self, template, answers):
        self.template, self.answers, self.prompts = template, list(answers), []
        self.reasoning_format = reasoning_format(template)

    def chat_prompt(self, messages, add_generation_prompt=True):
        return render(for_template(messages, self.reasoning_format), self.template,
                      add_generation_prompt=add_generation_prompt)

    def tokenize(self, text):
        return text.split()

    def stream_chat(self, messages, max_tokens, on_prefill=None, **sampling):
        self.prompts.append(self.chat_prompt(messages))
        return _Stream(self.answers.pop(0))


@pytest.mark.parametrize("template, first, second", [
    (QWEN3, THINK_TEXT, "<think>\nNow 3+3.\n</think>\n\nSix."),
    (GEMMA4, "<|channel>thought\nThe user asks 2+2.\n\nThat is 4.<channel|>It is **4**.",
     "<|channel>thought\nNow 3+3.<channel|>Six."),
    (QWEN35, "The user asks 2+2.\n\nThat is 4.\n</think>\n\nIt is **4**.", "Now 3+3.\n</think>\n\nSix."),
    (GPT_OSS, HARMONY_TEXT.replace("User asks 2+2. Answer 4.", "The user asks 2+2.\n\nThat is 4.")
     .replace("It is 4.", "It is **4**."),
     "<|channel|>analysis<|message|>Now 3+3.<|end|><|start|>assistant<|channel|>final<|message|>Six."),
])
def test_chat_session_shows_reasoning_apart_and_keeps_it_out_of_the_history(template, first, second):
    llm = _LLM(template, [first, second])
    session = ChatSession(llm)
    shown, thought = [], []
    session.ask("What is 2+2?", shown.append, write_reasoning=thought.append)
    assert "".join(thought) == "The user asks 2+2.\n\nThat is 4." and "".join(shown) == "It is **4**."
    assert (session.last_reasoning, session.last_answer) == ("The user asks 2+2.\n\nThat is 4.", "It is **4**.")
    assert session.history[-1] == {"role": "assistant", "content": "It is **4**.",
                                   "reasoning_content": "The user asks 2+2.\n\nThat is 4."}
    session.ask("And 3+3?", shown.append)                  # no write_reasoning: not shown
    assert "".join(shown) == "It is **4**.Six." and "".join(thought).count("3+3") == 0
    # The second prompt has the first answer, and (as the templates say) not its reasoning.
    assert "It is **4**." in llm.prompts[1] and "That is 4." not in llm.prompts[1]


def test_chat_session_without_reasoning_format_is_unchanged():
    llm = _LLM(LLAMA31, ["<think>literal</think> text"])
    session = ChatSession(llm)
    shown = []
    session.ask("Hi", shown.append, write_reasoning=lambda t: pytest.fail("no reasoning here"))
    assert "".join(shown) == "<think>literal</think> text"
    assert session.history[-1] == {"role": "assistant", "content": "<think>literal</think> text"}


def test_server_shapes():
    assert assistant_message("", "4") == {"role": "assistant", "content": "4"}
    assert assistant_message("why", "4") == {"role": "assistant", "content": "4", "reasoning_content": "why"}
    assert oai.chat_delta(REASONING, "a") == {"reasoning_content": "a"}
    assert oai.chat_delta(CONTENT, "b") == {"content": "b"}


@pytest.mark.parametrize("colour", [True, False])
def test_terminal_view_shows_reasoning_dimmed_then_the_answer(colour):
    from pydecode.cli.terminal import ReasoningView, Style, WordWrapper

    out = []
    view = ReasoningView(WordWrapper(out.append, 20), out.append, Style(colour))
    for kind, text in split_parts("<think>\nsome long reasoning here\n</think>\n\nThe answer."):
        (view.reasoning if kind == REASONING else view.content)(text)
    view.close()
    view.wrap.flush()
    text = "".join(out)
    if colour:
        assert text == "\033[2msome long reasoning\nhere\033[0m\n\nThe answer."
    else:
        assert text == "[thinking]\nsome long reasoning\nhere\n[/thinking]\n\nThe answer."
    # A reasoning cut off before any answer is closed too.
    out.clear()
    view = ReasoningView(WordWrapper(out.append, None), out.append, Style(colour))
    view.reasoning("half")
    view.close()
    assert "".join(out) == ("\033[2mhalf\033[0m\n\n" if colour else "[thinking]\nhalf\n[/thinking]\n\n")


def split_parts(text, fmt=THINK):
    s = ReasoningSplitter(fmt)
    return s.feed(text) + s.flush()


# ------------------------------------------------------------------ the server, in process

@pytest.fixture(scope="module")
def reasoning_server(tmp_path_factory):
    """The server's app over a tiny random model given Qwen3's (or gpt-oss's) template; a grammar
    makes it say what the test needs (its vocabulary is the bytes: the markers are spelt out)."""
    from tiny_models import tiny_server as serve

    yield from serve(tmp_path_factory, n_ctx=1024)   # gpt-oss's system prompt, spelt in bytes


def _gbnf(text):
    return "root ::= " + '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


@pytest.mark.parametrize("template, said, opened", [
    (QWEN3, "<think>\nhm, 2+2\n</think>\n\nFour.", False),
    (QWEN35, "hm, 2+2\n</think>\n\nFour.", True),
    (GPT_OSS, "<|channel|>analysis<|message|>hm, 2+2<|end|><|start|>assistant<|channel|>final<|message|>Four.", False),
    (GEMMA4, "<|channel>thought\nhm, 2+2<channel|>Four.", False),
])
def test_server_returns_reasoning_content_beside_content(reasoning_server, template, said, opened):
    llm, client = reasoning_server
    llm.model.gguf.metadata["tokenizer.chat_template"] = template
    llm.__dict__.pop("_reasoning_format", None)
    assert opens_reasoning(llm.chat_prompt([{"role": "user", "content": "2+2?"}]), llm.reasoning_format) == opened
    body = {"messages": [{"role": "user", "content": "2+2?"}], "max_tokens": 120, "grammar": _gbnf(said)}
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": "Four.", "reasoning_content": "hm, 2+2"}
    assert choice["finish_reason"] == "stop"

    r = client.post("/v1/chat/completions", json={**body, "stream": True})
    deltas = [json.loads(line[6:])["choices"][0]["delta"] for line in r.text.splitlines()
              if line.startswith("data: {")]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "hm, 2+2"
    assert "".join(d.get("content") or "" for d in deltas) == "Four."
    kinds = [k for d in deltas for k in d if k in ("reasoning_content", "content") and d[k]]
    assert kinds == sorted(kinds, key=lambda k: k == "content")      # the reasoning comes first

    # The answer sent back with its reasoning: the template drops it (Qwen3: before the last
    # user message; gpt-oss: every finished turn) or keeps it, as it says.
    history = body["messages"] + [choice["message"], {"role": "user", "content": "And 3+3?"}]
    prompt = llm.chat_prompt(history)
    assert "Four." in prompt and "hm, 2+2" not in prompt
