"""Property-based fuzzing (hypothesis) of every route of the deploy and capture services and of the dashboard's
/api and /media routes over real sockets: any path parameter, query parameter (numbers of any length among them,
thousands of digits included), Range header (positions of any length) and JSON (or raw) body, its strings holding
lone surrogates and other unpaired code points as JSON escapes or as raw bytes, gets an answer below 500, with a
write token so the handlers are reached; without a session the dashboard refuses every route that shows something.
The route list (and each route's query parameters) is read from the apps themselves, so a new route is fuzzed
without being listed here.
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
from .test_train_service import DATASET as TRAIN_DATASET
from .test_train_service import trainer  # noqa: F401 - the dashboard's training service, as a fixture
from .test_ui import DATASET as UI_DATASET
from .test_ui import (
    FLEET_DATASET,
    UI_WRITE,
    fleet_views,  # noqa: F401 - a fleet dataset and a rounds report beside the dashboard's
    ui,  # noqa: F401 - the dashboard over real services, as a fixture
)

OPS = "rl_ops_fuzz"
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
# Strings that are no text (lone surrogates: high, low, a pair reversed, one at the end) beside code points that are
# text but rare (noncharacters, the last code point), alone or inside other text.
unpaired = st.sampled_from(["\ud800", "\udfff", "\udc00\ud800", "x\ud83d", "\ud83d\ude00", "\ufffe", "\U0010ffff"])
any_code_point = st.characters(exclude_categories=())  # surrogates included (hypothesis leaves them out by default)
odd_texts = st.builds(lambda a, u, b: a + u + b, st.text(max_size=5), unpaired, st.text(max_size=5)) | st.text(
    any_code_point, max_size=10
)
strings = st.text(max_size=20) | odd_texts
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | strings,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(strings, inner, max_size=4),
    max_leaves=10,
)
names = (
    st.text(max_size=30)
    | odd_texts
    | st.sampled_from(["\x00", "..", "a/b", "\U0010ffff", "v1", "stable", "r1", "0" * 32])
)
# Numbers as a client may write them in a query: any sign and length, past int()'s 4,300 digits too.
lengths = st.integers(0, 40) | st.sampled_from([4300, 4301, 5000, 12_000])  # hypothesis draws small integers first
long_digits = st.builds(lambda first, n: first + "9" * n, st.sampled_from("0123456789"), lengths)
numeric_texts = (
    long_digits
    | st.integers(min_value=-(10**30), max_value=10**30).map(str)
    | st.from_regex(r"\A-?[0-9]{0,25}(\.[0-9]{0,10})?(e-?[0-9]{1,6})?\Z")
    | st.sampled_from(["-0", "nan", "inf", "-inf", "1e99999", "0x10", "\u0661\u0662", "\u00b2"])
)


def _routes(app) -> list[tuple[str, str, list[str]]]:
    """(method, path, its query parameters' names) of every route of `app`."""
    return sorted(
        (m, r.path, sorted(p.alias for p in r.dependant.query_params))
        for r in app.routes
        if isinstance(r, APIRoute)
        for m in r.methods
        if m != "HEAD"
    )


def _url(base: str, template: str, value: str) -> str:
    raw = quote(value.encode("utf-8", "surrogatepass"), safe="") or "x"
    return base + re.sub(r"\{[^}]+\}", raw, template)


def _body(value, escaped: bool = False) -> bytes:
    """`value` as JSON, a lone surrogate written as its escape ("\\ud800") or as the raw bytes Python would read."""
    return json.dumps(value, ensure_ascii=escaped).encode("utf-8", "surrogatepass")


def _query(data, params: list[str], values_of=names) -> str:
    """A query string giving some of `params` a value: one of `values_of` (lone surrogates escaped as their UTF-8
    bytes) or a number of any length."""
    values = {p: data.draw(values_of | numeric_texts) for p in params if data.draw(st.booleans())}
    return "?" + "&".join(f"{p}={quote(v.encode('utf-8', 'surrogatepass'), safe='')}" for p, v in values.items())


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
    method, template, params = data.draw(st.sampled_from(routes))
    target = _url(url, template, data.draw(names)) + _query(data, params)
    body = _body(data.draw(json_values), data.draw(st.booleans())) if method in ("POST", "PUT", "PATCH") else None
    r = httpx.request(method, target, content=body, headers={"authorization": f"Bearer {OPS}"}, timeout=30)
    assert r.status_code < 500, (method, target, r.text)


# The capture service's JSON requests (open, close), field by field: a body is one with one field (or none) replaced
# by any JSON value or left out, so that the models' checks pass or fail on one field and the service's own are
# reached (a random JSON value almost never has their keys). Valid opens do open episodes, fleet ones too, in two
# datasets (the same dataset with other features: a 409; past the robot's cap of open episodes: a 429). Facts are any
# flat values (lone surrogates, NaN, 65-bit integers) under any names, the service's own among them.
fact_values = st.none() | st.booleans() | st.integers() | st.floats() | strings | st.sampled_from([2**63, -(2**63) - 1])
fact_names = names | st.sampled_from(["robot_id", "seed", "kind", "episode_index", "task"])
CAPTURE_REQUESTS = {
    "/v1/episodes": {
        "dataset": st.sampled_from(["hf://buckets/lab/fuzz/datasets/a", "hf://buckets/lab/fuzz/datasets/b"]),
        "cameras": st.just({"top": [8, 8, 3]}),
        "state_dim": st.integers(1, 3),
        "action_dim": st.integers(1, 3),
        "fleet": st.booleans(),
    },
    "/v1/episodes/{episode_id}/close": {
        "task": strings | st.just("pick the cube"),
        "facts": st.dictionaries(fact_names, fact_values, max_size=4),
    },
}


def _capture_request(data, fields: dict) -> dict:
    """A request of `fields` (name -> its values), one of them (or none) replaced by any JSON value or left out."""
    body = {name: data.draw(values) for name, values in fields.items()}
    if (change := data.draw(st.sampled_from([None, *fields]))) is not None:
        if data.draw(st.booleans()):
            body[change] = data.draw(json_values)
        else:
            del body[change]
    return body


@FUZZ
@given(data=st.data())
def test_every_capture_route_answers_below_500(capture, tmp_path_factory, data):  # noqa: F811
    from services.capture.app import create_app

    tokens = tmp_path_factory.getbasetemp() / "fuzz-capture-tokens"
    tokens.write_text(f"{ROBOT_A} write lab\n")
    routes = _routes(create_app(load_settings(), tokens, BucketClient(capture.bucket.endpoint, WRITE_TOKEN)))
    method, template, params = data.draw(st.sampled_from(routes))
    target = _url(capture.endpoint, template, data.draw(names)) + _query(data, params)
    body, headers = None, {"authorization": f"Bearer {ROBOT_A}"}
    if method == "POST":
        kind = data.draw(
            st.sampled_from(["raw", "json", "request"] if template in CAPTURE_REQUESTS else ["raw", "json"])
        )
        if kind == "raw":
            body = data.draw(st.binary(max_size=200))
        else:
            value = data.draw(json_values) if kind == "json" else _capture_request(data, CAPTURE_REQUESTS[template])
            body = _body(value, data.draw(st.booleans()))
            if kind == "request" or data.draw(st.booleans()):  # without it FastAPI reads no JSON: the models unreached
                headers["content-type"] = "application/json"
    r = httpx.request(method, target, content=body, headers=headers, timeout=30)
    assert r.status_code < 500, (method, target, r.text)


# -- the dashboard ---------------------------------------------------------------------------------------------
# Values a dashboard route reads as a bucket URL, a report id or a file name: real ones (so the handlers go deep)
# beside broken ones.
bucket_urls = names | st.sampled_from(
    [
        UI_DATASET,
        FLEET_DATASET,
        TRAIN_DATASET,
        f"{UI_DATASET}/videos/observation.images.top/chunk-000/file-000.mp4",
        f"{UI_DATASET}/meta/info.json",
        f"{UI_DATASET}/x.mp4",
        "hf://buckets/lab/ui",
        "hf://buckets/lab",
        "hf://buckets/",
        "hf://buckets/lab/ui/../../x.mp4",
        "hf://buckets/nolab/none/datasets/x",
        "hf://datasets/lab/x",
        "s3://lab/x.mp4",
        "-1",
        "99999999999999999999",
    ]
)
positions = st.just("") | long_digits | st.integers(0, 10**12).map(str)
ranges = (
    st.none()
    | st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=20)
    | st.from_regex(r"\Abytes=-?[0-9]{0,12}-?[0-9]{0,12}(,[0-9]*-[0-9]*)?\Z")
    | st.builds(lambda a, b: f"bytes={a}-{b}", positions, positions)
)


@pytest.fixture(scope="module")
def dashboard(ui, fleet_views):  # noqa: F811
    """The dashboard, its /api and /media routes as (method, path, query parameter names), and its reports' ids
    (a loop's, and a rounds report's)."""
    from robotloop.ui.runs import report_id
    from services.ui.app import create_app

    app = create_app(load_settings(), ui.reports.parent / "ui.tokens")
    routes = [route for route in _routes(app) if route[1].startswith(("/api/", "/media/"))]
    return ui, routes, [report_id((ui.reports / "loop").resolve()), fleet_views]


def _dashboard_request(
    dashboard, data, headers: dict[str, str], slashes: bool = True
) -> tuple[str, str, httpx.Response]:
    """A request to one of the dashboard's routes; `slashes=False`: no "/" in path parameters (a "/" or "%2F"
    there, or a "." or "..", is another path, which may match no route)."""
    board, routes, report_ids = dashboard
    method, template, params = data.draw(st.sampled_from(routes))
    one_segment = names.filter(lambda n: "/" not in n and n not in (".", ".."))
    segments = (names if slashes else one_segment) | st.sampled_from(report_ids)
    path = re.sub(r"\{[^}]+\}", lambda _: _url("", "{x}", data.draw(segments)), template)
    query = _query(data, params, bucket_urls)
    if range_header := (data.draw(ranges) or "").strip():  # a header value cannot start or end with a space
        headers = {**headers, "range": range_header}
    body = None
    if method in ("POST", "PUT", "PATCH", "DELETE"):
        raw = data.draw(st.booleans())
        body = data.draw(st.binary(max_size=100)) if raw else _body(data.draw(json_values), data.draw(st.booleans()))
    r = httpx.request(method, board.url + path + query, content=body, headers=headers, timeout=30)
    return method, template, r


@FUZZ
@given(data=st.data())
def test_every_dashboard_route_answers_below_500(dashboard, data):
    # A write token, the CSRF header and the same origin: promote and roll back reach the deploy service.
    headers = {"authorization": f"Bearer {UI_WRITE}", "x-robotloop-ui": "1", "origin": dashboard[0].url}
    method, template, r = _dashboard_request(dashboard, data, headers)
    assert r.status_code < 500, (method, r.url, r.text)


OPEN = {("GET", "/api/health"), ("POST", "/api/session"), ("DELETE", "/api/session")}  # signing in and out


@FUZZ
@given(data=st.data(), cookie=st.none() | st.text(max_size=40))
def test_every_dashboard_route_refuses_without_a_session(dashboard, data, cookie):
    headers = {"x-robotloop-ui": "1", "origin": dashboard[0].url}
    if cookie is not None:  # not a session id this dashboard made
        headers["cookie"] = f"robotloop_ui={quote(cookie)}"
    method, template, r = _dashboard_request(dashboard, data, headers, slashes=False)
    if (method, template) in OPEN:
        assert r.status_code < 500, (method, r.url, r.text)
    elif r.request.content and method != "GET":  # a body FastAPI cannot read is refused before anything runs
        assert r.status_code in (401, 422), (method, r.url, r.text)
    else:
        assert r.status_code == 401, (method, r.url, r.status_code, r.text)
