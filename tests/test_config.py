from pathlib import Path

import pytest
from typer.testing import CliRunner

from robotloop.cli import app
from robotloop.config import SettingsError, load_settings


def test_sources_in_priority_order(tmp_path, monkeypatch):
    toml = tmp_path / "robotloop.toml"
    toml.write_text('[storage]\nendpoint = "http://from-toml:1"\ncache_max_bytes = 5\n')
    monkeypatch.setenv("ROBOTLOOP_CONFIG", str(toml))
    assert load_settings().storage.endpoint == "http://from-toml:1"

    monkeypatch.setenv("ROBOTLOOP_STORAGE__ENDPOINT", "http://from-env:2")
    settings = load_settings()
    assert settings.storage.endpoint == "http://from-env:2"
    assert settings.storage.cache_max_bytes == 5  # other toml keys survive the env override

    flags = load_settings({"storage": {"endpoint": "http://from-flag:3", "token": None}})
    assert flags.storage.endpoint == "http://from-flag:3"
    assert flags.storage.cache_max_bytes == 5  # an unset flag (None) hides nothing


def test_bad_settings_are_one_clear_error(tmp_path, monkeypatch):
    toml = tmp_path / "robotloop.toml"
    toml.write_text('[storage]\nendpont = "http://typo"\n')
    monkeypatch.setenv("ROBOTLOOP_CONFIG", str(toml))
    with pytest.raises(SettingsError, match="storage.endpont: unknown setting"):
        load_settings()
    toml.write_text("[storage\n")
    with pytest.raises(SettingsError, match="robotloop.toml: not valid TOML"):
        load_settings()
    toml.unlink()
    with pytest.raises(SettingsError, match="ROBOTLOOP_CONFIG=.*: no such file"):  # asked for by name: not skipped
        load_settings()
    monkeypatch.delenv("ROBOTLOOP_CONFIG")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ROBOTLOOP_STORAGE__EMBEDDED_PORT", "abc")
    with pytest.raises(SettingsError, match="storage.embedded_port: Input should be a valid integer"):
        load_settings()
    result = CliRunner().invoke(app, ["bucket", "ls", "hf://buckets/a/b"])
    assert result.exit_code == 1 and "error: bad settings" in result.output and "Traceback" not in result.output


def test_token_is_secret():
    settings = load_settings({"storage": {"token": "hf_secret"}})
    assert "hf_secret" not in repr(settings)
    assert settings.storage.token.get_secret_value() == "hf_secret"


def test_example_config_loads(monkeypatch):
    from pathlib import Path

    example = Path(__file__).parents[1] / "configs" / "robotloop.example.toml"
    monkeypatch.setenv("ROBOTLOOP_CONFIG", str(example))
    assert load_settings().storage.cache_max_bytes == 20 * 2**30


def test_service_urls_follow_host_and_port_unless_set(monkeypatch):
    monkeypatch.delenv("ROBOTLOOP_CONFIG", raising=False)
    settings = load_settings({"trainer": {"port": 9100}, "deploy": {"host": "0.0.0.0", "port": 9200}})
    assert settings.trainer.client_url == "http://127.0.0.1:9100"  # one port setting moves callers too
    assert settings.deploy.client_url == "http://127.0.0.1:9200"  # listening everywhere: reach it locally
    monkeypatch.setenv("ROBOTLOOP_DEPLOY__URL", "https://deploy.lab.internal")
    assert load_settings().deploy.client_url == "https://deploy.lab.internal"


def test_the_cache_folder_is_read_when_needed_not_at_import(tmp_path, monkeypatch):
    from robotloop.config import cache_home

    monkeypatch.setenv("ROBOTLOOP_CONFIG", "/dev/null")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "one"))
    assert cache_home() == tmp_path / "one" / "robotloop"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "two"))  # set after robotloop was imported: still counts
    settings = load_settings()
    assert settings.storage.embedded_root == tmp_path / "two" / "robotloop" / "buckets"
    assert settings.deploy.db == tmp_path / "two" / "robotloop" / "deploy" / "deploy.sqlite"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_home() == Path.home() / ".cache" / "robotloop"


def test_resolving_the_endpoint_starts_nothing(tmp_path, monkeypatch):
    from robotloop.storage import resolve_endpoint

    monkeypatch.setenv("ROBOTLOOP_CONFIG", "/dev/null")
    settings = load_settings({"storage": {"embedded_root": str(tmp_path / "embedded")}})
    assert resolve_endpoint(settings) is None  # nothing configured: the embedded server's case, not started here
    assert not (tmp_path / "embedded").exists()
    configured = load_settings({"storage": {"endpoint": "http://127.0.0.1:1", "token": "t"}})
    assert resolve_endpoint(configured) == ("http://127.0.0.1:1", "t")
