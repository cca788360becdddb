"""Front ends derived from one pydantic model: Typer options, a command line, an agent tool's parameters.

An option is written once, as a field of a pydantic model (type, default, bounds, description); these functions
turn the model into what each front end needs, so no front end re-lists the options:

- `typer_command(Model)`: a decorator giving a Typer command one `--flag` per field (help, bounds, default);
  the command receives the parsed values as one validated `Model`.
- `to_argv(instance)`: the same flags as a command line (how the training service starts `robotloop train`).
- `tool_parameters(Model)`: a decorator giving a strands `@tool` one parameter per field (type, bounds,
  description in the JSON schema the model reads); the tool receives one validated `Model`.

A field's flag is `--<name with dashes>`; `Flag("--other")` in its `Annotated` metadata renames it (e.g. the
list `datasets` is the repeatable `--dataset`).

Example:
    ```python
    >>> class Greet(BaseModel):
    ...     name: str = Field(description="Who to greet.")
    ...     times: int = Field(1, ge=1, description="How often.")
    >>> @typer_command(Greet)
    ... def greet(options: Greet) -> None:
    ...     print(("hello " + options.name + " ") * options.times)
    >>> to_argv(Greet(name="ada", times=2))
    ['--name', 'ada', '--times', '2']
    ```
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, get_args, get_origin

from pydantic import BaseModel, SecretStr, ValidationError
from pydantic.fields import FieldInfo


@dataclass(frozen=True)
class Flag:
    """`Annotated` metadata: the option's command-line name when it is not `--<field name with dashes>`, and other
    spellings the command also takes (e.g. LeRobot's `--policy.chunk_size`)."""

    name: str
    aliases: tuple[str, ...] = ()


def flag(name: str, info: FieldInfo) -> str:
    """The command-line flag of field `name`."""
    return next((m.name for m in info.metadata if isinstance(m, Flag)), "--" + name.replace("_", "-"))


def fields(model: type[BaseModel], names: Iterable[str] | None = None) -> dict[str, FieldInfo]:
    """The model's fields (all, or those in `names`), in declaration order."""
    chosen = None if names is None else set(names)
    return {n: f for n, f in model.model_fields.items() if chosen is None or n in chosen}


def _bound(info: FieldInfo, key: str) -> Any:
    """The field's `ge` or `le` (Typer's min and max); None when it has none."""
    return next((getattr(m, key) for m in info.metadata if getattr(m, key, None) is not None), None)


def _own_parameters(fn: Callable[..., Any], skip: str) -> list[inspect.Parameter]:
    """`fn`'s parameters but `skip`, their string annotations (`from __future__ import annotations`) evaluated in
    `fn`'s module: the wrapper that gets them lives in this one, where they would not resolve. `skip`'s own
    annotation is never evaluated (a model defined in a function is not visible from its module)."""
    params = []
    for p in inspect.signature(fn).parameters.values():
        if p.name != skip:
            params.append(
                p.replace(annotation=eval(p.annotation, fn.__globals__)) if isinstance(p.annotation, str) else p
            )
    return params


# -- Typer ------------------------------------------------------------------------------------------------------
def typer_parameters(
    model: type[BaseModel], names: Iterable[str] | None = None, required: bool = True
) -> list[inspect.Parameter]:
    """One keyword parameter per field, annotated with its `typer.Option` (flag, help, min/max, default).
    `required=False`: required fields are optional to Typer too (a config file may hold them; the model checks)."""
    import typer

    params = []
    for name, info in fields(model, names).items():
        kind = info.annotation
        # A Literal is a plain string to Typer: the model checks it, with the message that names the option.
        if get_origin(kind) is Literal:
            kind = str
        # A secret is typed in as text; the model wraps it. (Typer 0.27, the GPU image's, refuses SecretStr.)
        if SecretStr in (kind, *get_args(kind)):
            kind = str | None
        decl = flag(name, info)
        if kind is bool:  # both spellings, as Typer gives a bool by default: to_argv writes --no-<flag> for False
            decl = f"{decl}/--no-{decl[2:]}"
        aliases = next((m.aliases for m in info.metadata if isinstance(m, Flag)), ())
        option = typer.Option(decl, *aliases, help=info.description, min=_bound(info, "ge"), max=_bound(info, "le"))
        if info.is_required():
            default = inspect.Parameter.empty if required else None
        else:
            default = info.get_default(call_default_factory=True)
        params.append(
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=Annotated[kind, option])
        )
    return params


def typer_command(
    model: type[BaseModel], param: str = "options", config: Callable[[Path], dict[str, Any]] | None = None
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a Typer command taking `param: model` (besides its own options): the command gets one option
    per field of `model` and receives their values as one validated `model`.

    `config` (optional) reads a file into field values: the command then takes `--config FILE` (LeRobot's
    `--config_path` too), whose values stand where a flag is not given on the command line.

    A value the model refuses (a validator, a bound Typer cannot check) is a usage error naming the flag (or the
    file's key).
    """

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        import typer

        own = _own_parameters(fn, param)
        derived = typer_parameters(model, required=config is None)
        if config is not None:
            option = typer.Option(
                "--config",
                "--config-path",
                "--config_path",
                exists=True,
                dir_okay=False,
                help="A YAML or JSON file of these options (flags given here win over it).",
            )
            kind, keyword = Annotated[Path | None, option], inspect.Parameter.KEYWORD_ONLY
            derived.append(inspect.Parameter(CONFIG_PARAM, keyword, default=None, annotation=kind))
        names = set(model.model_fields)
        # The click context tells a flag given from a default: a config file's value stands only for the latter.
        ctx_name = next((p.name for p in own if p.annotation is typer.Context), None)
        if config is not None and ctx_name is None:
            ctx_name = CONTEXT_PARAM
            own = [inspect.Parameter(ctx_name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context), *own]

        @functools.wraps(fn)
        def command(*args: Any, **kwargs: Any) -> Any:
            values = {k: kwargs.pop(k) for k in list(kwargs) if k in names}
            from_file = kwargs.pop(CONFIG_PARAM, None)
            if config is not None:
                ctx = kwargs[ctx_name] if ctx_name in kwargs else args[0]
                values = _with_config(model, values, config, from_file, ctx)
                kwargs.pop(CONTEXT_PARAM, None)
            try:
                options = model.model_validate(values)
            except ValidationError as error:
                raise _usage_error(error, model, from_file) from None
            return fn(*args, **kwargs, **{param: options})

        # The model's options first (in its order), then the command's own: `--help` lists them so.
        leading = [p for p in own if p.kind is not p.KEYWORD_ONLY]  # ctx
        ordered = leading + derived + [p for p in own if p.kind is p.KEYWORD_ONLY]
        command.__signature__ = inspect.Signature(ordered)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in ordered}  # typer reads type hints from here
        del command.__wrapped__  # inspect.signature must not look past the new signature
        return command

    return decorate


CONFIG_PARAM = "config_file"
CONTEXT_PARAM = "derived_command_context"  # the click context, when the command itself takes none


def _with_config(
    model: type[BaseModel], values: dict[str, Any], read: Callable[[Path], dict[str, Any]], path: Path | None, ctx
) -> dict:
    """The flags' values, with the file's where a flag was not on the command line; unset required fields left
    out (the model then says which is missing). By the source's name: Typer 0.29 has its own copy of click."""
    given = {k: v for k, v in values.items() if ctx.get_parameter_source(k).name in ("COMMANDLINE", "ENVIRONMENT")}
    defaults = {k: v for k, v in values.items() if k not in given and v not in (None, (), [])}
    from_file = config_values(model, read(path)) if path else {}
    return {**defaults, **from_file, **given}


def config_values(model: type[BaseModel], data: dict[str, Any]) -> dict[str, Any]:
    """A config file's mapping as `model`'s fields: a key may be the field's name or any of its flags' (without
    the dashes, `-` or `_` alike: `dataset` for the repeatable `--dataset`, `policy.chunk_size`), and a single value
    stands for a one-item list. Unknown keys are kept as they are, for the model to refuse by name.

    Example:
        ```python
        >>> config_values(TrainOptions, {"dataset": "hf://buckets/lab/demos/datasets/cube", "batch-size": 8})
        {'datasets': ['hf://buckets/lab/demos/datasets/cube'], 'batch_size': 8}
        ```
    """
    names: dict[str, str] = {}
    for name, info in model.model_fields.items():
        aliases = next((m.aliases for m in info.metadata if isinstance(m, Flag)), ())
        for spelling in (name, flag(name, info), *aliases):
            names[_key(spelling)] = name
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = names.get(_key(str(key)), str(key))
        info = model.model_fields.get(name)
        if info is not None and get_origin(info.annotation) is list and not isinstance(value, list | tuple):
            value = [value]
        out[name] = value
    return out


def _key(spelling: str) -> str:
    return spelling.lstrip("-").replace("-", "_")


def _usage_error(error: ValidationError, model: type[BaseModel], config: Path | None) -> Exception:
    import typer

    first = error.errors()[0]
    where = str(first["loc"][0]) if first["loc"] else ""
    info = model.model_fields.get(where)
    hint = flag(where, info) if info else (f"{where!r} in {config}" if config else None)
    if first["type"] == "missing":  # a required option a config file could have held
        return typer.BadParameter("missing: give the option, or its key in a --config file", param_hint=hint)
    message = first["msg"].removeprefix("Value error, ")  # pydantic's prefix for a validator's error
    return typer.BadParameter(message, param_hint=hint)


# -- command line -----------------------------------------------------------------------------------------------
def to_argv(options: BaseModel, names: Iterable[str] | None = None) -> list[str]:
    """The flags that make `typer_command` parse `options` back (every field, defaults included: the command
    line shows exactly what the child runs with). Lists repeat their flag; None leaves a flag out.

    Example:
        ```python
        >>> to_argv(TrainOptions(datasets=["hf://buckets/a/b/datasets/c"], output="hf://buckets/a/b/models/r"))[:4]
        ['--dataset', 'hf://buckets/a/b/datasets/c', '--output', 'hf://buckets/a/b/models/r']
        ```
    """
    argv: list[str] = []
    for name, info in fields(type(options), names).items():
        value, option = getattr(options, name), flag(name, info)
        if value is None:
            continue
        if isinstance(value, bool):
            argv.append(option if value else "--no-" + option[2:])
        elif isinstance(value, list | tuple):
            argv += [a for item in value for a in (option, str(item))]
        else:
            argv += [option, str(value)]
    return argv


# -- agent tools ------------------------------------------------------------------------------------------------
def tool_parameters(
    model: type[BaseModel], exclude: Iterable[str] = (), param: str = "options"
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a tool method taking `param: model`: strands' `@tool` sees one parameter per field of `model`
    (its type, default, bounds and description go into the tool's JSON schema) and the method receives them
    as one validated `model` (a refused value raises pydantic's ValidationError, a ValueError).

    Fields in `exclude` are not offered to the model (they keep their defaults).
    """

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        own = _own_parameters(fn, param)
        skip = set(exclude)
        derived = [
            inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=_tool_field(info), annotation=info.annotation)
            for n, info in model.model_fields.items()
            if n not in skip
        ]
        names = {p.name for p in derived}

        @functools.wraps(fn)
        def method(*args: Any, **kwargs: Any) -> Any:
            values = {k: kwargs.pop(k) for k in list(kwargs) if k in names}
            return fn(*args, **kwargs, **{param: model.model_validate(values)})

        ordered = own + derived
        method.__signature__ = inspect.Signature(ordered)  # type: ignore[attr-defined]
        method.__annotations__ = {p.name: p.annotation for p in ordered if p.annotation is not p.empty}
        del method.__wrapped__
        return method

    return decorate


def _tool_field(info: FieldInfo) -> FieldInfo:
    """The field as a tool parameter's default: its type's constraints and description, without `Flag`."""
    kept = FieldInfo.merge_field_infos(info)
    kept.metadata = [m for m in info.metadata if not isinstance(m, Flag)]
    return kept


__all__ = ["Flag", "config_values", "fields", "flag", "to_argv", "tool_parameters", "typer_command"]
