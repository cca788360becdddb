"""Property-based fuzzing (hypothesis) of every route of the deploy and capture services over real sockets: any path
parameter and any JSON (or raw) body gets an answer below 500, with a write token so the handlers are reached.
The route list is read from the apps themselves, so a new route is fuzzed without being listed here.
(The training service's routes are not fuzzed: a valid random spec would start real training jobs.)
"""

from __future__ import annotations

import json
import re
from urllib.parse import quote

import httpx
import pytest
from fastapi.routing import APIRoute
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from robotloop.config import load_settings
from robotloop.deploy.local import start_local_deploy_service
from robotloop.storage import BucketClient

from .conftest import WRITE_TOKEN
from .test_capture_service import ROBOT_A, capture  # noqa: F401 - the real capture service, as a fixture

OPS = "rl_ops_fuzz"
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=10,
)
names = st.text(max_size=30) | st.sampled_from(["\x00", "..", "a/b", "\U0010ffff", "v1", "stable", "r1", "0" * 32])


def _routes(app) -> list[tuple[str, str]]:
    return sorted((m, r.path) for r in app.routes if isinstance(r, APIRoute) for m in r.methods if m != "HEAD")


def _url(base: str, template: str, value: str) -> str:
    raw = quote(value.encode("utf-8", "surrogatepass"), safe="") or "x"
    return base + re.sub(r"\{[^}]+\}", raw, template)


def _body(value) -> bytes:
    return json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass")


@pytest.fixture(scope="module")
def deploy(tmp_path_factory):
    from services.deploy.app import create_app

    base = tmp_path_factory.mktemp("fuzz-deploy")
    service = start_local_deploy_service(base / "served", OPS)
    (base / "tokens").write_text(f"{OPS} write *\n")
    routes = _routes(create_app(base / "tokens", base / "routes.sqlite", allow_any_signer=True))
    yield service.url, routes
    service.stop()


@FUZZ
@given(data=st.data())
def test_every_deploy_route_answers_below_500(deploy, data):
    url, routes = deploy
    method, template = data.draw(st.sampled_from(routes))
    target = _url(url, template, data.draw(names))
    body = _body(data.draw(json_values)) if method in ("POST", "PUT", "PATCH") else None
    r = httpx.request(method, target, content=body, headers={"authorization": f"Bearer {OPS}"}, timeout=30)
    assert r.status_code < 500, (method, target, r.text)


@FUZZ
@given(data=st.data())
def test_every_capture_route_answers_below_500(capture, tmp_path_factory, data):  # noqa: F811
    from services.capture.app import create_app

    tokens = tmp_path_factory.getbasetemp() / "fuzz-capture-tokens"
    tokens.write_text(f"{ROBOT_A} write lab\n")
    routes = _routes(create_app(load_settings(), tokens, BucketClient(capture.bucket.endpoint, WRITE_TOKEN)))
    method, template = data.draw(st.sampled_from(routes))
    target = _url(capture.endpoint, template, data.draw(names))
    raw = data.draw(st.booleans())
    body = (data.draw(st.binary(max_size=200)) if raw else _body(data.draw(json_values))) if method == "POST" else None
    r = httpx.request(method, target, content=body, headers={"authorization": f"Bearer {ROBOT_A}"}, timeout=30)
    assert r.status_code < 500, (method, target, r.text)
