"""Errors of loading and running a policy (`robotloop.deploy.runner` raises them). Apart from the runner so that
callers that only catch them (the CLI, the agent's tools) need not import torch."""

from ..errors import BadInput


class PolicyLoadError(BadInput, RuntimeError):
    """A checkpoint directory cannot be loaded as an ACT policy; the message names the file and the cause."""


class NonFiniteAction(BadInput, RuntimeError):
    """The policy produced NaN or infinite actions (bad weights, or stats with zero std); nothing was executed."""
