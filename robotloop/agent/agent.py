"""`make_agent`: a strands Agent with robotloop's tools and the configured model.

Example:
    ```python
    >>> agent = make_agent(load_settings())
    >>> print(agent("record 5 demos of transfer cube into hf://buckets/lab/demos/datasets/cube"))
    ```
"""

from __future__ import annotations

from typing import Any

from strands import Agent
from strands.models import Model
from strands.tools.executors import SequentialToolExecutor

from ..config import Settings
from .model import build_model
from .tools import AgentContext, make_tools

SYSTEM_PROMPT = """You operate robotloop, which closes the robot-learning loop: record demonstrations into \
storage buckets, train ACT policies streaming from them, publish signed releases to robots, and watch, \
evaluate and roll them back. Use the tools for every action and fact; never invent URLs, job ids or results. \
Datasets live at hf://buckets/<namespace>/<bucket>/datasets/<name>, training runs at \
hf://buckets/<namespace>/<bucket>/models/<run>. A tool that fails answers why: fix the argument or tell the \
user, do not retry blindly. Publishing, promoting and rolling back change what real robots run: do them only \
when the user asked for it. Finish with a short summary of what was done and the key numbers."""


def make_agent(
    settings: Settings, model: Model | None = None, ctx: AgentContext | None = None, **agent_kwargs: Any
) -> Agent:
    """An Agent over robotloop's tools, with `model` or the one `settings.agent` configures.

    `agent_kwargs` go to `strands.Agent` (e.g. `callback_handler=None` to print nothing while it streams).

    Raises:
        ModelUnavailable: the configured provider's client package is missing, or no model id for it.
    """
    ctx = ctx or AgentContext(settings)
    # One tool at a time, in the order the model asked: "publish v8, then promote it" must not race.
    agent_kwargs.setdefault("tool_executor", SequentialToolExecutor())
    return Agent(
        model=model or build_model(settings.agent), tools=make_tools(ctx), system_prompt=SYSTEM_PROMPT, **agent_kwargs
    )
