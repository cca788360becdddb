"""Errors of loading, exporting and running a policy (`robotloop.deploy.runner`, `onnx_runner`, `onnx_export` and
`policy` raise them). Apart from those modules so that callers that only catch them (the CLI, the agent's tools, the
robot runtime) need not import torch."""

from ..errors import BadInput, Unavailable, Unprocessable


class PolicyLoadError(BadInput, RuntimeError):
    """A checkpoint directory cannot be loaded as an ACT policy; the message names the file and the cause."""


class BackendUnavailable(PolicyLoadError):
    """The policy cannot run here with the backend asked for: its runtime (torch, onnxruntime, an execution
    provider) is not installed on this machine, or the release has no policy in that backend's format. The machine's
    setup, not the release, is what is wrong: a robot skips such a release until it restarts, never for good."""


class NonFiniteAction(BadInput, RuntimeError):
    """The policy produced NaN or infinite actions (bad weights, or stats with zero std); nothing was executed."""


class PolicyRunError(Unavailable, RuntimeError):
    """The policy's runtime failed while computing an action (ONNX Runtime's own error: an execution provider that
    ran out of memory, a kernel that failed); nothing was executed."""


class OnnxExportError(Unprocessable, RuntimeError):
    """The policy cannot be exported to ONNX (the message names the layer and the op), or the export does not
    agree with torch."""
