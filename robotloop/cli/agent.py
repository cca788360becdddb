"""`robotloop agent "..."`: ask the agent to record, train, publish, roll back or evaluate, with robotloop's tools."""

from __future__ import annotations

import json
from typing import Annotated, get_args

import typer
from rich.markup import escape

from ..errors import RobotloopError
from .output import cli_console, fail

console = cli_console()
PROVIDER_HELP = "bedrock, openai (any OpenAI-compatible endpoint) or ollama. Default: agent.provider (bedrock)."


def agent(
    ctx: typer.Context,
    prompt: Annotated[
        str, typer.Argument(help='What to do, e.g. "record 5 demos of transfer cube and train on them".')
    ],
    provider: Annotated[str | None, typer.Option(help=PROVIDER_HELP)] = None,
    model_id: Annotated[str | None, typer.Option(help="Model id. Default: agent.model_id.")] = None,
    base_url: Annotated[str | None, typer.Option(help="openai/ollama endpoint. Default: agent.base_url.")] = None,
) -> None:
    """Run the agent on PROMPT: it calls robotloop's tools (shown as they run) and answers."""
    # rich's Markdown and Panel are imported here, not at module level: they cost every `robotloop` command ~20 ms.
    from pydantic import ValidationError
    from rich.markdown import Markdown
    from rich.panel import Panel

    from ..agent import make_agent

    settings = ctx.obj
    providers = get_args(type(settings.agent).model_fields["provider"].annotation)  # the config's one list
    if provider is not None and provider not in providers:
        raise typer.BadParameter(f"{provider!r}: choose one of {', '.join(providers)}", param_hint="--provider")
    try:
        overrides = {k: v for k, v in {"provider": provider, "model_id": model_id, "base_url": base_url}.items() if v}
        settings = settings.model_copy(
            update={"agent": settings.agent.model_validate({**settings.agent.model_dump(), **overrides})}
        )
        runner = make_agent(settings, callback_handler=None)
    except (RobotloopError, ValidationError) as error:  # ValidationError: a bad --provider / --model-id
        raise fail(error) from None
    _show_tool_calls(runner)
    try:
        result = runner(prompt)
    except Exception as error:  # noqa: BLE001 (providers raise their own types: no credentials, unreachable, ...)
        raise fail(f"{type(error).__name__}: {error}", f"the model call failed ({settings.agent.provider}): ") from None
    console.print(Panel(Markdown(str(result).strip() or "(no answer)"), title="agent", border_style="green"))


def _show_tool_calls(runner) -> None:
    """Print each tool call with its arguments, then its result (shortened), as it happens."""
    from strands.hooks import AfterToolCallEvent, BeforeToolCallEvent

    def before(event: BeforeToolCallEvent) -> None:
        args = ", ".join(f"{k}={v!r}" for k, v in (event.tool_use.get("input") or {}).items())
        console.print(f"[cyan]→ {event.tool_use['name']}[/cyan]({escape(args)})")

    def after(event: AfterToolCallEvent) -> None:
        result = event.result or {}
        text = " ".join(c.get("text") or json.dumps(c.get("json")) for c in result.get("content", []))
        style = "red" if result.get("status") == "error" else "dim"
        console.print(f"  [{style}]{escape(text[:600] + ('…' if len(text) > 600 else ''))}[/{style}]")

    runner.add_hook(before, BeforeToolCallEvent)
    runner.add_hook(after, AfterToolCallEvent)
