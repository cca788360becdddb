"""The robotloop agent: strands-agents tools over the library (the same calls as the CLI) and a model from settings.

Top layer: it may call storage, sim, capture, train, deploy and loop; nothing below imports it.
"""

from .agent import SYSTEM_PROMPT, make_agent
from .model import ModelUnavailable, build_model
from .tools import AgentContext, RobotloopTools, make_tools

__all__ = [
    "SYSTEM_PROMPT",
    "AgentContext",
    "ModelUnavailable",
    "RobotloopTools",
    "build_model",
    "make_agent",
    "make_tools",
]
