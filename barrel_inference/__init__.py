"""barrel-inference: a local LLM inference daemon speaking the OpenAI, Anthropic and Ollama APIs."""

__version__ = "0.1.0"
