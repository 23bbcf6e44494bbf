"""OpenAI request bodies (the fields we honour; unknown fields are ignored as OpenAI clients send many)."""

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool


class StreamOptions(BaseModel):
    include_usage: StrictBool = False


class _Sampling(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    max_tokens: int | None = None
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0)  # extension (vLLM-style)
    ignore_eos: StrictBool = False  # extension (vLLM-style): EOS does not end the answer
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    n: int = Field(default=1, ge=1, le=1)
    mode: Literal["ar", "sd", "ssd"] | None = None  # extension: decoding mode; None = the server default

    def stop_list(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


class CompletionRequest(_Sampling):
    prompt: str | list[str]


class ContentPart(BaseModel):
    type: Literal["text"]
    text: str


class Message(BaseModel):
    role: Literal["system", "user", "assistant", "developer"]
    content: str | list[ContentPart]

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ChatCompletionRequest(_Sampling):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = None
