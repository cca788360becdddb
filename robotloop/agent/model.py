"""The model behind `robotloop agent`, from the `agent` settings: Amazon Bedrock by default, or any
OpenAI-compatible endpoint (vLLM, llama.cpp's server, LM Studio, OpenAI itself), or an Ollama server.

Providers are imported only when chosen: Bedrock needs boto3 (a dependency of strands-agents), the others
their own client package, which robotloop does not install.

Example:
    ```python
    >>> from robotloop.config import AgentSettings
    >>> model = build_model(AgentSettings(provider="openai", model_id="qwen3-8b", base_url="http://127.0.0.1:8000/v1"))
    ```
"""

from __future__ import annotations

import os
from typing import Any

from strands.models import Model

from ..config import AgentSettings
from ..errors import Unavailable

# what to install for each provider's client package
EXTRAS = {"openai": "strands-agents[openai]", "ollama": "strands-agents[ollama]"}
OLLAMA_HOST = "http://127.0.0.1:11434"


class ModelUnavailable(Unavailable, RuntimeError):
    """The configured model cannot be built: a missing client package or missing settings."""


def build_model(cfg: AgentSettings) -> Model:
    """The strands model `cfg` names.

    Raises:
        ModelUnavailable: the provider's client package is not installed (the message names the pip package),
            or openai/ollama without `agent.model_id`.
    """
    if cfg.provider == "bedrock":
        return _bedrock(cfg)
    if not cfg.model_id:
        raise ModelUnavailable(
            f"the {cfg.provider} provider needs a model id: set agent.model_id "
            "(ROBOTLOOP_AGENT__MODEL_ID or --model-id)"
        )
    return _openai(cfg) if cfg.provider == "openai" else _ollama(cfg)


def _sampling(cfg: AgentSettings) -> dict[str, Any]:
    return {"max_tokens": cfg.max_tokens, **({"temperature": cfg.temperature} if cfg.temperature is not None else {})}


def _bedrock(cfg: AgentSettings) -> Model:
    from strands.models.bedrock import BedrockModel

    extra = {
        "model_id": cfg.model_id,
        "region_name": cfg.region,
        "endpoint_url": cfg.base_url,
        "api_key": cfg.api_key.get_secret_value() if cfg.api_key else None,
    }
    return BedrockModel(**{k: v for k, v in extra.items() if v is not None}, **_sampling(cfg))


def _openai(cfg: AgentSettings) -> Model:
    openai_model = _import("openai", "strands.models.openai", "OpenAIModel")
    key = cfg.api_key.get_secret_value() if cfg.api_key else os.environ.get("OPENAI_API_KEY")
    # Local servers rarely check the key, but the openai client refuses to start without one.
    client_args = {"api_key": key or ("unused" if cfg.base_url else None)}
    if cfg.base_url:
        client_args["base_url"] = cfg.base_url
    return openai_model(client_args=client_args, model_id=cfg.model_id, params=_sampling(cfg))


def _ollama(cfg: AgentSettings) -> Model:
    ollama_model = _import("ollama", "strands.models.ollama", "OllamaModel")
    return ollama_model(cfg.base_url or OLLAMA_HOST, model_id=cfg.model_id, **_sampling(cfg))


def _import(provider: str, module: str, name: str) -> type:
    import importlib

    try:
        return getattr(importlib.import_module(module), name)
    except ImportError as error:
        raise ModelUnavailable(
            f"the {provider} provider needs the '{error.name}' package: pip install '{EXTRAS[provider]}'"
        ) from None
