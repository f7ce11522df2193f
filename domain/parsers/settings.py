"""A server's parser settings (`--reasoning-parser`, `--tool-call-parser`, `--reasoning-config`)."""

from __future__ import annotations

import json
from dataclasses import dataclass

from domain.parsers.parsed import REASONING_PARSERS, TOOL_CALL_PARSERS, ParserConfig
from domain.structured.tool_calls import ToolCallMode

DEFAULT_START = "<think>"
DEFAULT_END = "</think>"


@dataclass(frozen=True, slots=True)
class ReasoningStrings:
    """The strings that open and close a reasoning block (vLLM's `--reasoning-config`)."""

    start: str = DEFAULT_START
    end: str = DEFAULT_END

    def __post_init__(self) -> None:
        if not self.start or not self.end or self.start == self.end:
            raise ValueError("the reasoning start and end strings must differ and not be empty")

    @classmethod
    def from_json(cls, text: str) -> ReasoningStrings:
        """`{"reasoning_start_str": ..., "reasoning_end_str": ...}`; either may be left out."""
        value = json.loads(text)
        if not isinstance(value, dict):
            raise ValueError("--reasoning-config must be a JSON object")
        unknown = set(value) - {"reasoning_start_str", "reasoning_end_str"}
        if unknown:
            raise ValueError(f"--reasoning-config has unknown keys: {', '.join(sorted(unknown))}")
        start = value.get("reasoning_start_str", DEFAULT_START)
        end = value.get("reasoning_end_str", DEFAULT_END)
        if not isinstance(start, str) or not isinstance(end, str):
            raise ValueError("--reasoning-config strings must be strings")
        return cls(start, end)


@dataclass(frozen=True, slots=True)
class ParserSettings:
    """Which parsers the server runs; valid on construction, as vLLM checks its flags."""

    reasoning_parser: str | None = None
    tool_call_parser: str | None = None
    auto_tool_choice: bool = False
    reasoning: ReasoningStrings = ReasoningStrings()
    # Whether `--reasoning-config` named the strings (else they are the defaults).
    reasoning_configured: bool = False
    # vLLM's `--structured-outputs-config` `enable_in_reasoning`: a grammar constrains the
    # reasoning too, from the first token, instead of starting after it.
    grammar_in_reasoning: bool = False

    def __post_init__(self) -> None:
        if self.reasoning_parser not in (None, *REASONING_PARSERS):
            raise ValueError(
                f"--reasoning-parser must be one of {', '.join(REASONING_PARSERS)}, "
                f"not {self.reasoning_parser!r}"
            )
        if self.tool_call_parser not in (None, *TOOL_CALL_PARSERS):
            raise ValueError(
                f"--tool-call-parser must be one of {', '.join(TOOL_CALL_PARSERS)}, "
                f"not {self.tool_call_parser!r}"
            )
        if self.auto_tool_choice and self.tool_call_parser is None:
            raise ValueError("--enable-auto-tool-choice needs --tool-call-parser")

    def config(
        self, *, tools: bool, prompt: str, forced: ToolCallMode | None = None
    ) -> ParserConfig:
        """The parsers of a request whose templated prompt is `prompt`; `tools` says it asked
        for tool calls the parser should find (`tool_choice: "auto"` with tools), `forced` is
        the tool call it forces, if any."""
        return ParserConfig(
            reasoning_parser=self.reasoning_parser,
            tool_call_parser=self.tool_call_parser,
            tools=tools and self.auto_tool_choice,
            prompt_in_reasoning=self.reasoning_parser is not None and self.opens(prompt),
            reasoning_start=self.reasoning.start,
            reasoning_end=self.reasoning.end,
            forced=forced,
        )

    @property
    def budget_strings(self) -> ReasoningStrings | None:
        """The strings a thinking budget counts between and forces, as vLLM takes them from
        `--reasoning-config` or the reasoning parser; None when the server has neither."""
        if self.reasoning_parser is None and not self.reasoning_configured:
            return None
        return self.reasoning

    def grammar_waits(self, prompt: str) -> bool:
        """Whether a grammar starts only after the reasoning an output after `prompt` begins
        with (else it constrains the first token)."""
        return not self.grammar_in_reasoning and self.begins_in_reasoning(prompt)

    def begins_in_reasoning(self, prompt: str) -> bool:
        """Whether the reasoning parser reads an output after `prompt` as beginning inside a
        block, as `domain.parsers.choice` does: `deepseek_r1` always, `qwen3` when the prompt
        opened one; False without a parser."""
        if self.reasoning_parser is None:
            return False
        return self.reasoning_parser == "deepseek_r1" or self.opens(prompt)

    def opens(self, prompt: str) -> bool:
        """Whether `prompt` ends inside a reasoning block: a chat template that appends the
        start string makes the output begin in reasoning."""
        return prompt.rfind(self.reasoning.start) > prompt.rfind(self.reasoning.end)


def grammar_in_reasoning(text: str) -> bool:
    """`--structured-outputs-config` as JSON: `{"enable_in_reasoning": true|false}`."""
    value = json.loads(text)
    if not isinstance(value, dict):
        raise ValueError("--structured-outputs-config must be a JSON object")
    unknown = set(value) - {"enable_in_reasoning"}
    if unknown:
        raise ValueError(
            f"--structured-outputs-config has unknown keys: {', '.join(sorted(unknown))}"
        )
    enabled = value.get("enable_in_reasoning", False)
    if not isinstance(enabled, bool):
        raise ValueError("--structured-outputs-config enable_in_reasoning must be a boolean")
    return enabled


NO_PARSERS = ParserSettings()
