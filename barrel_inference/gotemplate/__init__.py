"""Go text/template, the subset Ollama's model templates use, in pure Python (parse.py, exec.py), and
Ollama's way of running a model template over a conversation (ollama.py).

Shared by the worker, which renders a Modelfile's TEMPLATE, and the gateway, which checks one at
/api/create so that a template this renderer cannot run is refused there, naming the construct.
"""

from .ollama import GoTemplateError, OllamaTemplate, check

__all__ = ["GoTemplateError", "OllamaTemplate", "check"]
