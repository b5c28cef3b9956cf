"""Translations between the compatible APIs (Ollama, Anthropic, OpenAI Responses) and OpenAI chat."""
