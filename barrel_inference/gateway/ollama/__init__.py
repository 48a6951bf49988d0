"""The Ollama API family: wire structs (wire.py), pure conversions (convert.py), model management routes
(management.py) and the route table (routes.py). The generation side (/api/chat, /api/generate, /api/embed)
plugs in beside management.py."""
