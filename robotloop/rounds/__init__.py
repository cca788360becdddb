"""Rounds of the loop through the fleet (`robotloop loop --rounds K --fleet N`): after round 0 (`robotloop.loop`),
each round a sim fleet runs the stable release and records what it does, the expert takes over its stalls and
re-demonstrates its failures, and the next release trains on demos and fleet data together; it is promoted only
when it beats stable on the same evaluation seeds.

- `run`: `run_rounds`, `RoundSettings`, the per-round results and the same-expert-frames baseline;
- `fleet`: the sim fleet of one round (a process per robot running `robotloop.deploy.RobotRuntime`);
- `options`: `RoundsOptions`, the CLI's flags on top of the loop's;
- `report`: the rounds in the loop's report (report.json's `rounds`, a table in report.md).
"""

# Lazy (PEP 562), as `robotloop.loop`: the CLI reads `robotloop.rounds.options` without loading torch.
from robotloop.lazy import lazy_names

_LAZY = {
    "RoundResult": "run",
    "RoundSettings": "run",
    "RoundsReport": "run",
    "run_rounds": "run",
    "write_rounds_report": "report",
    "RoundsOptions": "options",
}

__getattr__ = lazy_names(__name__, _LAZY)

# What a report and the dashboard say of a round `run.has_new_draws` found nothing to train on (here: the dashboard
# reads it without loading the rounds' heavy modules).
NOT_TRAINED = "not trained: nothing new"
MAX_BRANCHES = 8  # branch points per failed fleet episode: each costs an expert drive of up to MAX_REPLAN_STEPS
MAX_REDEMO_NEAR = 10  # fresh scenes demonstrated near each fleet scene the policy did not win alone: a whole demo each

__all__ = [
    "MAX_BRANCHES",
    "MAX_REDEMO_NEAR",
    "NOT_TRAINED",
    "RoundResult",
    "RoundSettings",
    "RoundsOptions",
    "RoundsReport",
    "run_rounds",
    "write_rounds_report",
]
