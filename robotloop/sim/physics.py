"""MuJoCo stepping that reproduces dm_control's `control.Environment` bit for bit.

gym-aloha wraps its tasks in `dm_control.rl.control.Environment(control_timestep=DT, n_sub_steps=None)`, so
each control step runs `compute_n_steps(DT, model.opt.timestep)` = round(0.02 / 0.002) = 10 physics steps
(the MJCF leaves `<option timestep>` at MuJoCo's default 0.002). dm_control's default `legacy_step=True`
steps as `mj_step2; mj_step x (n-1); mj_step1`, so contacts (hence rewards) are those of the final state.
Resets run `mj_forward` with actuation disabled, as `Physics.reset_context` does.
"""

from __future__ import annotations

from pathlib import Path

import mujoco

from robotloop.sim.constants import DT


def load_model(xml_path: Path) -> mujoco.MjModel:
    return mujoco.MjModel.from_xml_path(str(xml_path))


def n_substeps(model: mujoco.MjModel, control_dt: float = DT, tolerance: float = 1e-8) -> int:
    """dm_control's `compute_n_steps`: control period / physics timestep, which must be an integer."""
    ratio = control_dt / model.opt.timestep
    if control_dt < model.opt.timestep or abs(ratio - round(ratio)) > tolerance:
        raise ValueError(f"control timestep {control_dt} is not a multiple of physics timestep {model.opt.timestep}")
    return int(round(ratio))


def forward_without_actuation(model: mujoco.MjModel, data: mujoco.MjData) -> None:
    """`Physics.after_reset`: mj_forward with the actuation disable flag set."""
    saved = model.opt.disableflags
    model.opt.disableflags = saved | mujoco.mjtDisableBit.mjDSBL_ACTUATION
    try:
        mujoco.mj_forward(model, data)
    finally:
        model.opt.disableflags = saved


def legacy_step(model: mujoco.MjModel, data: mujoco.MjData, nstep: int) -> None:
    """dm_control `Physics.step(nstep)` with `legacy_step=True` (Euler / implicit integrators)."""
    if model.opt.integrator == mujoco.mjtIntegrator.mjINT_RK4:
        mujoco.mj_step(model, data, nstep)
    else:
        mujoco.mj_step2(model, data)
        if nstep > 1:
            mujoco.mj_step(model, data, nstep - 1)
    mujoco.mj_step1(model, data)


def contact_pairs(data: mujoco.MjData) -> set[tuple[int, int]]:
    """Ordered (geom1, geom2) id pairs of the active contacts."""
    n = data.ncon
    if n == 0:
        return set()
    return set(zip(data.contact.geom1[:n].tolist(), data.contact.geom2[:n].tolist(), strict=True))


def geom_id(model: mujoco.MjModel, name: str) -> int:
    gid = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_GEOM, name)
    if gid < 0:
        raise KeyError(f"no geom named {name!r} in the model")
    return gid
